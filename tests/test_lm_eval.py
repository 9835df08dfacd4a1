"""lm-evaluation-harness scores `python -m minillm serve` exactly as it scores transformers.

The course's two tasks (evals/, run from the repository root) are run twice on the shipped target:
with lm-eval's `hf` backend (transformers in this process) and with its `local-completions` backend
against the server in a subprocess. The scores must be equal, and so must every document's answer.

`local-completions` sends token ids, lm-eval's default (`tokenized_requests=True`): both backends
then score and continue the very same token sequences, cut by one tokenizer (the target's, loaded
by transformers), so what is compared is the engine, not two tokenisations of the same text. The
server takes one prompt per request, hence `batch_size=1`.

The multiple-choice task needs `echo` and `logprobs` (OpenAI's legacy completions contract): for
each choice lm-eval sends `prompt=[context + continuation ids], max_tokens=1, echo=true, logprobs=1,
temperature=0` and sums `choices[0].logprobs.token_logprobs[len(context):-1]`, so the list must
hold one entry per prompt token (the first may be null) and then one for the generated token, even
when that token is the end of text. `is_greedy` compares each of those with the largest value of
the matching `top_logprobs` dict.

lm_eval is a dev dependency: without it these tests fail, they never skip.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "minillm" / "assets" / "target"
SERVED_NAME = "minillm-target"
MC_TASK, GEN_TASK = "minillm_arith_mc", "minillm_arith_gen"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
LOGLIKELIHOOD_ATOL = 1e-3  # minillm's model vs transformers: equal logits to ~1e-5 in fp32, not bit for bit


def evaluate(model: str, model_args: str, task: str | list[str]) -> dict:
    """lm_eval.simple_evaluate on evals/ from the repository root (where the tasks' data_files point)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        for name, value in OFFLINE.items():
            patch.setenv(name, value)
        return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task] if isinstance(task, str)
                                       else task, task_manager=TaskManager(include_path=str(ROOT / "evals")),
                                       batch_size=1, log_samples=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python -m minillm serve` on a free loopback port; yields its /v1/completions URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path_factory.mktemp("lm_eval_server") / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", str(port),
                                 "--default-max-tokens", "16"], stdout=log, stderr=subprocess.STDOUT,
                                cwd=ROOT, env={**os.environ, **OFFLINE})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"no /health within 120 s:\n{log_path.read_text()}"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield url + "/v1/completions"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def hf_results(server):
    """Both tasks with lm-eval's `hf` backend (asks for the server first, so it loads meanwhile)."""
    return evaluate("hf", f"pretrained={TARGET},dtype=float32,device=cpu", [MC_TASK, GEN_TASK])


def served_results(url: str, task: str) -> dict:
    args = {"model": SERVED_NAME, "base_url": url, "tokenizer": TARGET, "tokenizer_backend": "huggingface",
            "tokenized_requests": True, "num_concurrent": 1, "max_retries": 1, "max_length": 2048}
    return evaluate("local-completions", ",".join(f"{k}={v}" for k, v in args.items()), task)


def by_doc(results: dict, task: str) -> list[dict]:
    return sorted(results["samples"][task], key=lambda sample: sample["doc_id"])


def test_hf_scores_of_the_shipped_target(hf_results):
    """The tasks measure something: above chance (1/4 for the choices), below perfect (negative answers)."""
    assert hf_results["results"][MC_TASK]["acc,none"] == 29 / 40
    assert hf_results["results"][MC_TASK]["acc_norm,none"] == 29 / 40
    assert hf_results["results"][GEN_TASK]["exact_match,strip"] == 33 / 40


def test_generation_task_scores_as_hf(hf_results, server):
    served = served_results(server, GEN_TASK)
    assert served["results"][GEN_TASK] == hf_results["results"][GEN_TASK]
    for ours, theirs in zip(by_doc(served, GEN_TASK), by_doc(hf_results, GEN_TASK), strict=True):
        assert (ours["doc_id"], ours["arguments"], ours["resps"], ours["filtered_resps"], ours["exact_match"]) == \
            (theirs["doc_id"], theirs["arguments"], theirs["resps"], theirs["filtered_resps"], theirs["exact_match"])


def test_multiple_choice_task_scores_as_hf(hf_results, server):
    served = served_results(server, MC_TASK)
    assert served["results"][MC_TASK] == hf_results["results"][MC_TASK]
    for ours, theirs in zip(by_doc(served, MC_TASK), by_doc(hf_results, MC_TASK), strict=True):
        assert (ours["doc_id"], ours["arguments"], ours["acc"], ours["acc_norm"]) == \
            (theirs["doc_id"], theirs["arguments"], theirs["acc"], theirs["acc_norm"])
        for (ll, greedy), (hf_ll, hf_greedy) in zip(ours["filtered_resps"], theirs["filtered_resps"], strict=True):
            assert math.isclose(ll, hf_ll, rel_tol=0, abs_tol=LOGLIKELIHOOD_ATOL), (ours["doc_id"], ll, hf_ll)
            assert greedy == hf_greedy, (ours["doc_id"], ours["arguments"])
