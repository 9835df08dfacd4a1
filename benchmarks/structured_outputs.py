"""What a structured output's mask costs a decode step: constrained against free, at batch 1 and 16.

    python benchmarks/structured_outputs.py [--vllm-python PATH] [--rounds 5] [--tokens 64]
    python benchmarks/structured_outputs.py --plot-only

The shipped target decodes `--tokens` new tokens for each of `batch` requests (greedy), two ways:

    free      no constraint (ignore_eos: every request runs all its tokens)
    masked    every request under a JSON schema it cannot complete within its tokens (an array of at least
              30 records), so every step fills and applies a real pushdown automaton's mask for every row

Both ways run in one engine, alternating round by round (the machine's speed drifts over minutes). From
the engine's trace: the median duration of the steps in which every request decoded (`step_ms`); the
ratio is the median over rounds of masked / free. Beside it, the whole run's output tokens per second,
the figure comparable with vLLM: with --vllm-python, `vllm.LLM` (its CPU build, xgrammar backend) runs
the same two ways on the same checkpoint and token ids, in its own process, alternating likewise.

Jump-forward (`EngineConfig(jump_forward=True)`): the same 16 requests under a schema with long keys and
enum values, greedy, in an engine with and one without it, alternating: output tokens per forward pass
of a request (each request's passes counted from the trace), and the whole run's time.

Results: benchmarks/results/structured_outputs.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from statistics import median

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from minillm import EngineConfig, LLMEngine, SamplingParams, load  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CHECKPOINT = ROOT / "minillm" / "assets" / "target"
BATCHES = (1, 16)
SCHEMA = {"type": "array", "minItems": 30,
          "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                     "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                     "role": {"enum": ["king", "queen", "fool", "knight"]}},
                    "required": ["name", "age", "role"], "additionalProperties": False}}
PROMPT = "The court of KING RICHARD, as a JSON list of records:"
RECORD = {"type": "object", "properties": {"character_name": {"type": "string", "maxLength": 10},
                                          "years_of_age": {"type": "integer", "minimum": 0, "maximum": 120},
                                          "disposition": {"enum": ["melancholy", "choleric", "sanguine"]}},
          "required": ["character_name", "years_of_age", "disposition"], "additionalProperties": False}

# vllm.LLM the same two ways, in the vLLM venv; prints one JSON line. The guard: vLLM starts worker processes.
VLLM_SCRIPT = """
import json, sys, time
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams
    job = json.loads(open(sys.argv[1]).read())
    llm = LLM(model=job["model"], dtype="float32", max_num_seqs=max(job["batches"]), max_model_len=job["max_model_len"],
              seed=0)
    prompt = TokensPrompt(prompt_token_ids=job["prompt"])
    def params(way):
        extra = {"structured_outputs": StructuredOutputsParams(json=job["schema"])} if way == "masked" else {}
        return SamplingParams(temperature=0, max_tokens=job["tokens"], ignore_eos=True, **extra)
    llm.generate([prompt] * 2, params("masked"), use_tqdm=False)  # warm-up: the grammar compiles here
    out = {}
    for batch in job["batches"]:
        rounds = {"free": [], "masked": []}
        for r in range(job["rounds"]):
            for way in (("free", "masked") if r % 2 == 0 else ("masked", "free")):
                start = time.perf_counter()
                outs = llm.generate([prompt] * batch, params(way), use_tqdm=False)
                took = time.perf_counter() - start
                rounds[way].append(sum(len(o.outputs[0].token_ids) for o in outs) / took)
        out[str(batch)] = rounds
    print("RESULT " + json.dumps(out), flush=True)
"""


def decode_step_ms(engine: LLMEngine, batch: int, first_step: int) -> float:
    """The median duration of the steps since `first_step` in which all `batch` requests decoded."""
    steps = [s.duration for s in engine.trace.steps if s.step >= first_step and s.decode_tokens == batch
             and s.num_tokens == batch]
    return median(steps) * 1e3


def run_way(engine: LLMEngine, ids: list[int], batch: int, tokens: int, way: str) -> tuple[float, float]:
    """(median all-decoding step ms, output tokens per second) of one batch run."""
    structured = {"json": SCHEMA} if way == "masked" else None
    params = SamplingParams(temperature=0, max_new_tokens=tokens, ignore_eos=structured is None, structured=structured)
    first = engine.trace.next_step
    start = time.perf_counter()
    request_ids = [engine.add_request(ids, params).request_id for _ in range(batch)]
    while engine.has_unfinished():
        engine.step()
    took = time.perf_counter() - start
    outputs = [engine.output(i) for i in request_ids]
    assert all(o.finish_reason == "length" for o in outputs), [o.finish_reason for o in outputs]
    for i in request_ids:
        engine.release(i)
    return decode_step_ms(engine, batch, first), sum(len(o.token_ids) for o in outputs) / took


def run_minillm(args, ids: list[int]) -> dict:
    model, tokenizer = load()
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=max(BATCHES), max_model_len=args.max_model_len,
                                                      kv="paged"))
    run_way(engine, ids, 2, 8, "masked")  # warm-up: the grammar compiles here
    out = {}
    for batch in BATCHES:
        rounds = {"free": [], "masked": []}
        for r in range(args.rounds):
            for way in (("free", "masked") if r % 2 == 0 else ("masked", "free")):
                rounds[way].append(run_way(engine, ids, batch, args.tokens, way))
        free_ms, masked_ms = [s for s, _ in rounds["free"]], [s for s, _ in rounds["masked"]]
        free_tps, masked_tps = [t for _, t in rounds["free"]], [t for _, t in rounds["masked"]]
        out[str(batch)] = {
            "free_step_ms": median(free_ms), "masked_step_ms": median(masked_ms),
            "step_ratio": median(m / f for m, f in zip(masked_ms, free_ms)),
            "free_tokens_per_s": median(free_tps), "masked_tokens_per_s": median(masked_tps),
            "throughput_ratio": median(m / f for m, f in zip(masked_tps, free_tps)),
            "rounds": rounds}
        row = out[str(batch)]
        print(f"minillm batch {batch:2d}: decode step {row['free_step_ms']:.2f} -> {row['masked_step_ms']:.2f} ms "
              f"(x{row['step_ratio']:.3f}); throughput x{row['throughput_ratio']:.3f}", flush=True)
    return out


def run_jump_forward(args, ids: list[int]) -> dict:
    model, tokenizer = load()
    engines = {way: LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=16, max_model_len=args.max_model_len,
                                                             kv="paged", jump_forward=way == "jump"))
               for way in ("sampled", "jump")}
    params = SamplingParams(temperature=0, max_new_tokens=128, structured={"json": RECORD})
    rounds = {way: [] for way in engines}
    for r in range(args.rounds + 1):  # the first round warms up (the grammar compiles)
        for way in (("sampled", "jump") if r % 2 == 0 else ("jump", "sampled")):
            engine = engines[way]
            first = engine.trace.next_step
            start = time.perf_counter()
            request_ids = [engine.add_request(ids, params).request_id for _ in range(16)]
            while engine.has_unfinished():
                engine.step()
            took = time.perf_counter() - start
            outputs = [engine.output(i) for i in request_ids]
            assert all(o.finish_reason == "stop" for o in outputs), [o.finish_reason for o in outputs]
            for i in request_ids:
                engine.release(i)
            request_passes = sum(sum(1 for slot in step.slots if slot is not None and slot.num_tokens)
                                 for step in engine.trace.steps if step.step >= first)
            tokens = sum(len(o.token_ids) for o in outputs)
            if r:
                rounds[way].append({"seconds": took, "tokens": tokens, "request_passes": request_passes})
    out = {way: {"tokens_per_pass": median(x["tokens"] / x["request_passes"] for x in rows),
                 "seconds": median(x["seconds"] for x in rows), "tokens": median(x["tokens"] for x in rows)}
           for way, rows in rounds.items()}
    out["time_ratio"] = median(j["seconds"] / s["seconds"] for j, s in zip(rounds["jump"], rounds["sampled"]))
    out["forced_tokens"] = engines["jump"].jump_forward_tokens
    print(f"jump-forward: {out['sampled']['tokens_per_pass']:.2f} -> {out['jump']['tokens_per_pass']:.2f} tokens "
          f"per pass; run time x{out['time_ratio']:.3f}", flush=True)
    return out


def run_vllm(args, ids: list[int]) -> dict:
    job = {"model": str(CHECKPOINT), "prompt": ids, "schema": SCHEMA, "tokens": args.tokens, "rounds": args.rounds,
           "batches": list(BATCHES), "max_model_len": args.max_model_len}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        (Path(tmp) / "run.py").write_text(VLLM_SCRIPT)
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
        done = subprocess.run([args.vllm_python, "run.py", "job.json"], capture_output=True, text=True, cwd=tmp,
                              env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"vllm.LLM failed (exit code {done.returncode}):\n{done.stderr[-3000:]}")
    out = {}
    for batch, rounds in json.loads(lines[-1].removeprefix("RESULT ")).items():
        out[batch] = {"free_tokens_per_s": median(rounds["free"]), "masked_tokens_per_s": median(rounds["masked"]),
                      "throughput_ratio": median(m / f for m, f in zip(rounds["masked"], rounds["free"])),
                      "rounds": rounds}
        print(f"vLLM    batch {int(batch):2d}: throughput x{out[batch]['throughput_ratio']:.3f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", help="a Python with vllm-cpu installed (its own venv)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    path = RESULTS / "structured_outputs.json"
    if args.plot_only:
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return
    _, tokenizer = load()
    ids = tokenizer.encode(PROMPT)
    saved = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
             "tokens": args.tokens, "rounds": args.rounds, "schema": SCHEMA, "minillm": run_minillm(args, ids),
             "jump_forward": run_jump_forward(args, ids)}
    if args.vllm_python:
        version = subprocess.run([args.vllm_python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                                 text=True)
        saved["vllm_version"] = version.stdout.strip().splitlines()[-1] if version.returncode == 0 else None
        saved["vllm"] = run_vllm(args, ids)
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(saved, indent=1) + "\n")
    plot(saved, path.with_suffix(".png"))


def plot(saved: dict, path: Path) -> None:
    engines = [e for e in ("minillm", "vllm") if e in saved]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.8 / len(engines)
    for j, engine in enumerate(engines):  # time per output token, masked / free: 1 / the throughput ratio
        ratios = [1 / saved[engine][str(b)]["throughput_ratio"] for b in BATCHES]
        xs = [i + (j - (len(engines) - 1) / 2) * width for i in range(len(BATCHES))]
        bars = ax.bar(xs, ratios, width=width, label=f"{engine}: time per token, masked / free")
        for bar, ratio in zip(bars, ratios):
            ax.annotate(f"{ratio:.2f}", (bar.get_x() + bar.get_width() / 2, ratio), ha="center", va="bottom",
                        fontsize=8)
    steps = [saved["minillm"][str(b)]["step_ratio"] for b in BATCHES]
    ax.plot(range(len(BATCHES)), steps, "k^", label="minillm: decode step, masked / free")
    ax.axhline(1.0, color="#888", lw=0.8)
    ax.axhline(1.1, color="#c44", lw=0.8, ls="--", label="10% slower")
    ax.set(xticks=range(len(BATCHES)), xticklabels=[f"batch {b}" for b in BATCHES], ylim=(0, 1.6),
           ylabel="constrained / unconstrained", title="What a JSON schema's mask costs a decode step")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
