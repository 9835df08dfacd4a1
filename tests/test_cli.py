"""`python -m minillm generate`: prints the text then its metrics; bad input is one line, exit 2."""

import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minillm", *args], capture_output=True, text=True, timeout=300)


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
    (("generate", "hi", "--top-p", "1.5"), "top_p must be in"),
    (("generate", "hi", "--max-new-tokens", "0"), "max_new_tokens must be"),
    (("generate", "hi", "--temperature", "abc"), "invalid float value"),
    (("generate", ""), "prompt is empty"),
    (("generate", "hi " * 3000), "context"),
    (("generate",), "required: prompt"),
    (("generate", "hi", "--model", "minillm-course/no-such-model"), "could not fetch"),
])
def test_bad_input_is_one_clear_line_and_exit_status_2(args, message):
    proc = run(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


def test_help_lists_the_options():
    proc = run("generate", "--help")
    assert proc.returncode == 0
    for option in ("--model", "--max-new-tokens", "--temperature", "--top-p", "--top-k", "--seed",
                   "--ignore-eos", "--stream"):
        assert option in proc.stdout
