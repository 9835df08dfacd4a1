"""`python -m minillm generate`: prints the text then its metrics; bad input is one line, exit 2.

The first tests start the real command in a subprocess; the rest call `minillm.cli.main` in this
process (the same code, without paying torch's import for every case)."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from minillm import ASSETS_DIR
from minillm.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minillm", *args], capture_output=True, text=True, timeout=300)


def run_here(capsys, *args: str) -> subprocess.CompletedProcess:
    """`main(args)` in this process, reported like `run`."""
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's errors
        code = exit_.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def test_one_plus_one_greedy():
    proc = run("generate", "What is 1+1? Answer:", "--max-new-tokens", "4", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    text, _, metrics = proc.stdout.partition("\n\n[")
    assert text.strip().startswith("2")
    assert "TTFT" in metrics and "finish:" in metrics


def test_streaming_prints_the_same_text():
    args = ("generate", "ROMEO:", "--max-new-tokens", "20", "--temperature", "0")
    plain, streamed = run(*args), run(*args, "--stream")
    assert streamed.returncode == 0
    assert streamed.stdout.partition("\n\n[")[0].rstrip("\n") == plain.stdout.partition("\n\n[")[0].rstrip("\n")


@pytest.mark.parametrize("args, message", [
    (("generate", "hi", "--model", "/no/such/folder"), "not a folder"),
    (("generate", "hi", "--top-p", "1.5"), "top_p must be a number in"),
    (("generate", "hi", "--max-new-tokens", "0"), "max_new_tokens must be"),
    (("generate", "hi", "--temperature", "abc"), "invalid float value"),
    (("generate", ""), "prompt is empty"),
    (("generate", "hi " * 3000), "context"),
    (("generate",), "required: prompt"),
    (("generate", "hi", "--model", "minillm-course/no-such-model"), "could not fetch"),
    (("generate", "hi", "--device", "bogus"), "argument --device: device must be"),
    (("generate", "hi", "--seed", str(2**64)), "seed must be an integer in [0, 2**64 - 1]"),
    (("generate", "hi", "--seed", "-1"), "seed must be"),
    (("generate", "hi", "--top-k", "0"), "top_k must be"),
    (("generate", "hi", "--temperature", "1e400"), "temperature must be"),
])
def test_bad_input_is_one_clear_line_and_exit_status_2(capsys, args, message):
    proc = run_here(capsys, *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_a_gpu_is_one_line(capsys):
    proc = run_here(capsys, "generate", "hi", "--device", "cuda")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "argument --device" in proc.stderr and "no CUDA GPU" in proc.stderr


def _config_with(**changes) -> bytes:
    config = json.loads((ASSETS_DIR / "target" / "config.json").read_text())
    config.update(changes)
    return json.dumps({k: v for k, v in config.items() if v is not None}).encode()


@pytest.mark.parametrize("damage, message", [
    ({"model.safetensors": b"not a safetensors file"}, "model.safetensors could not be loaded"),
    ({"config.json": b"{ not json"}, "config.json is not a readable JSON file"),
    ({"config.json": b"[1, 2]"}, "config.json should hold a JSON object"),
    ({"config.json": b'{"model_type": "llama"}'}, "config.json does not describe a supported model"),
    ({"config.json": _config_with(vocab_size=4096.0)}, "vocab_size must be an integer >= 1, got 4096.0"),
    ({"config.json": _config_with(num_attention_heads=0)}, "config.json does not describe a supported model"),
    ({"config.json": _config_with(rms_norm_eps="x")}, "rms_norm_eps must be a positive number"),
    ({"config.json": _config_with(rope_parameters=None, rope_scaling={"rope_type": "linear"})},
     "linear RoPE scaling needs a positive number 'factor'"),
    ({"config.json": _config_with(max_position_embeddings=10**13)}, "describes could not be built"),
    ({"generation_config.json": b'{"eos_token_id": 2.0}'}, "eos_token_id must be a token id"),
    ({"generation_config.json": b'{"eos_token_id": "0"}'}, "eos_token_id must be a token id"),
    ({"model.safetensors.index.json": b'{"weight_map": {"a": ["x"]}}'}, "has no weight_map of tensor names"),
    ({"model.safetensors.index.json": b'{"weight_map": {"a": "../../etc/passwd"}}'}, "points outside its folder"),
    ({"tokenizer.json": None}, "is tokenizer.json missing?"),
])
def test_a_broken_checkpoint_is_one_line_naming_the_file(capsys, tmp_path, damage, message):
    folder = tmp_path / "broken"
    shutil.copytree(ASSETS_DIR / "target", folder)
    for name, content in damage.items():
        if content is None:
            (folder / name).unlink()
        else:
            (folder / name).write_bytes(content)
    proc = run_here(capsys, "generate", "hi", "--model", str(folder))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert str(folder) in lines[0]


def test_a_temperature_too_small_to_divide_by_is_greedy(capsys):
    tiny = run_here(capsys, "generate", "ROMEO:", "--max-new-tokens", "8", "--temperature", "1e-40")
    greedy = run_here(capsys, "generate", "ROMEO:", "--max-new-tokens", "8", "--temperature", "0")
    assert tiny.returncode == 0, tiny.stderr
    assert tiny.stdout.partition("\n\n[")[0] == greedy.stdout.partition("\n\n[")[0]


def test_help_lists_the_options(capsys):
    proc = run_here(capsys, "generate", "--help")
    assert proc.returncode == 0
    for option in ("--model", "--max-new-tokens", "--temperature", "--top-p", "--top-k", "--seed",
                   "--ignore-eos", "--stream"):
        assert option in proc.stdout


def test_serve_answers_openai_requests_on_loopback(tmp_path):
    """`python -m minillm serve --port 0` announces the port the system gave it, once it listens (a
    request right after the line is answered): health, a greedy completion equal to `generate`'s text,
    and the engine flags reaching the engine (a bad combination is one line, exit status 2)."""
    import re
    import threading

    import httpx

    server = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", "0", "--prefix-cache",
                               "--max-num-seqs", "4", "--max-model-len", "256", "--allowed-origins",
                               "http://lab.example"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(120, server.kill)  # a server that never announces must not hang the suite
    watchdog.start()
    lines = []
    try:
        while not (lines and lines[-1].startswith("serving")) and (line := server.stdout.readline()):
            lines.append(line)
        found = re.match(r"serving 'minillm-target' on http://127\.0\.0\.1:(\d+)/v1 ", lines[-1] if lines else "")
        assert found, "".join(lines)
        port = int(found.group(1))
        assert port != 0
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/health", timeout=5).status_code == 200  # no retry: it listens once announced
        answer = httpx.post(url + "/v1/completions", json={"model": "minillm-target", "prompt": "What is 1+1? Answer:",
                                                          "max_tokens": 4, "temperature": 0}, timeout=30).json()
        assert answer["choices"][0]["text"].strip().startswith("2"), answer
        assert answer["usage"]["completion_tokens"] == 4 or answer["choices"][0]["finish_reason"] == "stop"
        preflight = httpx.options(url + "/v1/completions", headers={"Origin": "http://lab.example",
                                                                    "Access-Control-Request-Method": "POST"})
        assert preflight.headers.get("access-control-allow-origin") == "http://lab.example"  # --allowed-origins
    finally:
        watchdog.cancel()
        server.terminate()
        server.communicate(timeout=30)
    bad = subprocess.run([sys.executable, "-m", "minillm", "serve", "--kv", "contiguous", "--prefix-cache"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "prefix_cache=True needs kv='paged'" in bad.stderr


def test_serve_on_a_port_in_use_is_one_line_and_announces_nothing(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_here(capsys, "serve", "--port", str(port))
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"minillm: error: cannot listen on 127.0.0.1:{port}: Address already in use"], proc.stderr
    proc = run_here(capsys, "serve", "--host", "192.0.2.1", "--port", "0")  # an address of no machine (TEST-NET-1)
    assert proc.returncode == 2 and proc.stderr.startswith("minillm: error: cannot listen on 192.0.2.1:0: ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["serve", "--port", "70000"], "must be >= 0 and <= 65535"),
    (["serve", "--default-max-tokens", "0"], "must be >= 1"),
    (["serve", "--trace-steps", "0"], "must be >= 1"),
    (["bench", "--rate", "0"], "must be > 0"),
    (["bench", "--rate", "nan"], "must be > 0"),
    (["bench", "--num-prompts", "0"], "must be >= 1"),
    (["bench", "--slo-ttft", "nan"], "must be > 0"),
    (["bench", "--slo-tpot", "-1"], "must be > 0"),
    (["bench", "--request-timeout", "0"], "must be > 0"),
    (["bench", "--duration", "-1"], "must be > 0"),
])
def test_bad_serve_and_bench_flags_are_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and err.count("\n") == 1


def test_serve_keeps_a_short_trace_unless_asked():
    """A server's trace holds every running request's block table per step: 64 steps by default."""
    from minillm.cli import build_parser, engine_config

    assert engine_config(build_parser().parse_args(["serve"])).trace_max_steps == 64
    assert engine_config(build_parser().parse_args(["serve", "--trace-steps", "5000"])).trace_max_steps == 5000


def test_serve_turns_jump_forward_on_when_asked():
    from minillm.cli import build_parser, engine_config

    assert not engine_config(build_parser().parse_args(["serve"])).jump_forward
    assert engine_config(build_parser().parse_args(["serve", "--jump-forward"])).jump_forward


def test_serve_quantizes_when_asked():
    from minillm.cli import build_parser, engine_config

    assert engine_config(build_parser().parse_args(["serve"])).quantization is None
    config = engine_config(build_parser().parse_args(["serve", "--quantization", "int4",
                                                      "--quantization-group-size", "32"]))
    assert (config.quantization, config.quantization_group_size) == ("int4", 32)
    assert config.kv_cache_dtype == "auto"
    assert engine_config(build_parser().parse_args(["serve", "--kv-cache-dtype", "fp8"])).kv_cache_dtype == "fp8"
    with pytest.raises(ValueError, match="needs kv='paged'"):
        engine_config(build_parser().parse_args(["serve", "--kv", "contiguous", "--kv-cache-dtype", "int8"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--quantization", "int3"])
