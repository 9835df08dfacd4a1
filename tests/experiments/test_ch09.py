"""Chapter 9's live experiments hold or warn under load, and their words follow their numbers: a
streamed request and two load runs against a real server (uvicorn in a thread, a tiny model); and
lm-eval's evaluation through `python -m minillm serve`, run from a folder that is not the
repository's (as the notebook runs in chapters/), equal to its hf backend, with one progress line
of its own in the notebook."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai
import pytest

from experiments.ch09 import (
    EVAL_METRICS,
    Server,
    describe_eval,
    describe_load,
    eval_task,
    free_port,
    little_rows,
    little_words,
    lm_eval_side_by_side,
    load_at_two_rates,
    start_server,
    streaming_timing,
)
from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.loadgen import Slo
from minillm.server import build_app
from tests.cpu_hog import cpu_hog
from tests.hf_reference import ByteTokenizer
from tests.test_engine import paged_budget
from tests.test_server import _Server

PROMPTS = [f"Request {i}: " + "to be or not to be, " * (1 + i % 3) for i in range(12)]


@pytest.fixture(scope="module")
def server(model):
    config = EngineConfig(max_num_seqs=4, max_model_len=256, kv="paged", block_size=16,
                          kv_cache_bytes=paged_budget(model, 16, 64))
    served = _Server(build_app(AsyncLLM(engine=LLMEngine(model, ByteTokenizer(), config)), "tiny"))
    yield served
    served.stop()


def _load(server, rounds: int = 2):
    """A few seconds: twelve requests of 16 tokens, at 8 per second (they rarely meet) and all at once
    (three times the server's 4 slots: most wait a whole batch), with an SLO the light rate meets."""
    return load_at_two_rates(server.url, "tiny", PROMPTS, light=8.0, heavy=float("inf"), rounds=rounds,
                             max_tokens=16, slo=Slo(ttft_s=0.04, tpot_s=0.05))


def test_under_a_cpu_hog_the_findings_hold_or_the_guard_fires(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with cpu_hog():
        streamed = streaming_timing(client, "tiny", max_tokens=8, repeats=2)
        loaded = _load(server)
    assert streamed.warning or streamed.holds, streamed.text
    assert loaded.warning or loaded.holds, loaded.text
    assert "rerun the load cell of section 5" in (loaded.warning or "rerun the load cell of section 5")


def test_the_words_are_the_numbers(server):
    finding = _load(server, rounds=1)
    n = finding.numbers
    for key in ("ttft_light_s", "ttft_heavy_s"):
        assert f"{n[key] * 1e3:,.0f} ms" in finding.text
    assert all(f"{r:.2f}x" in finding.text for r in n["throughput_rounds"]) or "rounds disagree" in finding.text
    rows = little_rows(finding)
    assert len(rows) == 2 and all(lam > 0 and w > 0 for _, _, (lam, w, _) in rows)
    assert little_words(rows)


def _numbers(**changes) -> dict:
    return {"rates": (4.0, 24.0), "ttft_light_s": 0.06, "tpot_light_s": 0.02, "ttft_heavy_s": 1.5,
            "slo_ttft_s": 0.5, "slo_tpot_s": 0.05, "queueing": 25.0, "queueing_rounds": (24.0, 26.0),
            "queueing_agrees": True, "rounds": 2, "requests": 30, "met_light": [30, 29], "met_heavy": [8, 9],
            "finished_heavy": 7.0, "tokens_light": 200, "tokens_heavy": 450, "throughput_gain": 2.2,
            "throughput_rounds": (2.1, 2.3), "goodput_light": 3.4, "goodput_heavy": 1.1, "tpot_heavy_s": 0.03,
            "tpot_rounds": (1.4, 1.6), "goodput_light_rounds": [3.4, 3.3], "goodput_heavy_rounds": [1.1, 1.2]} | changes


@pytest.mark.parametrize(("changes", "holds", "says"), [
    ({}, True, "could not keep up"),
    ({"ttft_light_s": 0.9}, False, "Even at 4 requests/s the server fell behind"),
    ({"met_light": [1, 4], "tpot_light_s": 0.14}, False, "only 1 and 4 of 30 requests met the SLO"),
    ({"ttft_heavy_s": 0.3, "queueing": 5.0, "finished_heavy": 22.0, "met_heavy": [29, 30]}, False,
     "Even at 24 requests/s it kept up"),
    # the committed run of a learner's walk: p50 under the SLO, but 7.7 of 24 requests/s finished
    ({"ttft_heavy_s": 0.134, "queueing": 2.1, "finished_heavy": 7.7, "met_heavy": [16, 16]}, False,
     "a queue formed, though the median hides it"),
    ({"queueing_agrees": False, "queueing_rounds": (0.8, 40.0)}, False, "the rounds do not agree"),
    ({"ttft_light_s": 0.45, "queueing": 1.6, "queueing_rounds": (1.2, 2.0)}, False, "queued at both rates"),
])
def test_the_words_follow_each_outcome(changes, holds, says):
    text, held = describe_load(_numbers(**changes))
    assert held == holds and says in text
    assert f"{_numbers(**changes)['ttft_heavy_s'] * 1e3:,.0f} ms" in text


def test_little_words_say_when_the_law_and_the_samples_part():
    assert "agree within" in little_words([(4.0, 1, (3.4, 1.1, 3.8))])
    assert "differ by up to" in little_words([(4.0, 1, (3.4, 1.1, 2.0))])


def test_the_words_say_when_the_rounds_disagree():
    text, _ = describe_load(_numbers(throughput_rounds=(1.46, 0.93), tpot_rounds=(0.9, 1.2)))
    assert "rose in round 1 (1.46x) and fell in round 2 (0.93x)" in text and "fuller batches use" not in text
    assert "grew in round 2 (1.20x) and fell in round 1 (0.90x)" in text and "a step that carries more" not in text
    text, _ = describe_load(_numbers())
    assert "rose in every round" in text and "TPOT p50 grew in every round" in text


def test_a_stopped_server_is_one_line_not_a_traceback(tmp_path, capsys):
    """After Run All the last cell has stopped the server: the cells that need it say so, and a load
    run against its address reports what completed instead of dividing by zero."""
    stopped = Server(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]), "http://x", tmp_path)
    assert stopped.poll() is None and stopped.why_not() is None and stopped.ready()
    stopped.stop()
    assert not stopped.ready() and "stopped by the last cell: rerun the cell that starts it" in capsys.readouterr().out
    crashed = Server(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), "http://x", tmp_path / "log")
    crashed.process.wait()
    assert "exited by itself (exit code 3)" in crashed.why_not()
    url = f"http://127.0.0.1:{free_port()}"  # nothing answers there
    finding = load_at_two_rates(url, "tiny", PROMPTS[:3], light=50.0, heavy=float("inf"), rounds=1, max_tokens=4)
    assert not finding.holds and "0 of 3 completed at 50 requests/s in round 1: connection refused" in finding.text
    assert little_rows(finding) == [] and "nothing to compare" in little_words([])


def test_the_server_log_is_where_the_file_browser_shows_it(tmp_path):
    log = tmp_path / "logs" / "server.log"
    try:
        start_server(log=log, timeout_s=20, command=lambda port: [sys.executable, "-c", "print('no model here')"])
    except RuntimeError as err:
        assert "exited while starting" in str(err) and "no model here" in str(err) and log.exists()
    else:
        raise AssertionError("a server that exits at once must not be taken for a running one")


def test_the_eval_tasks_read_their_questions_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # lm-eval opens data_files relative to here; the notebook's is chapters/
    for task in EVAL_METRICS:
        config = eval_task(task)
        assert config["task"] == task
        for path in config["dataset_kwargs"]["data_files"].values():
            assert Path(path).is_absolute() and Path(path).is_file(), path


def test_lm_eval_through_the_server_equals_its_hf_backend_and_prints_only_its_progress(tmp_path, monkeypatch, capfd):
    """The chapter's evaluation on the first 3 questions of each task: equal scores and answers, every
    message of lm-eval's (info lines, progress bars, git's) in the log rather than in the notebook,
    which shows one progress line of its own."""
    served = start_server(["--max-num-seqs", "4", "--max-model-len", "256"], log=tmp_path / "server.log")
    try:
        monkeypatch.chdir(tmp_path)
        capfd.readouterr()
        finding = lm_eval_side_by_side(served.url, "minillm-target", 256, limit=3, log=tmp_path / "lm-eval.log")
        printed = capfd.readouterr()
    finally:
        served.stop()
    n = finding.numbers
    assert finding.holds and n["served"] == n["hf"], finding.text
    assert set(n["hf"]) == {(task, metric) for task, metrics in EVAL_METRICS.items() for metric in metrics}
    assert all(q == {**q, "same": 3, "questions": 3} for q in n["per_question"].values())
    assert "same answer to every question: 3 of 3" in finding.text
    shown = [piece.strip() for piece in printed.out.replace("\n", "\r").split("\r") if piece.strip()]
    assert shown[:2] == ["lm-eval, 1 of 2: the two tasks through the server ...",
                         "lm-eval, 2 of 2: the same with transformers in this process ..."], printed
    assert len(shown) == 3 and shown[2].startswith("lm-eval ran twice in ") and printed.err == "", printed
    assert "local-completions" in (tmp_path / "lm-eval.log").read_text()


def _eval_numbers(**changes) -> dict:
    scores = {("minillm_arith_mc", "acc,none"): 0.75, ("minillm_arith_mc", "acc_norm,none"): 0.75,
              ("minillm_arith_gen", "exact_match,strip"): 0.95}
    return {"served": dict(scores), "hf": dict(scores), "limit": 20, "seconds": {"served": 2.0, "hf": 6.0},
            "log": Path("logs/chapter09-lm-eval.log"),
            "per_question": {"minillm_arith_mc": {"same": 20, "questions": 20, "loglikelihood_gap": 3.9e-5},
                             "minillm_arith_gen": {"same": 20, "questions": 20}}} | changes


def test_the_eval_words_follow_the_scores():
    text, holds = describe_eval(_eval_numbers())
    assert holds and "equal scores on every metric" in text and "20 of 20 (minillm_arith_gen)" in text
    assert "3.9e-05" in text
    mixed = _eval_numbers(per_question={"minillm_arith_mc": {"same": 18, "questions": 20, "loglikelihood_gap": 0.7},
                                        "minillm_arith_gen": {"same": 20, "questions": 20}})
    text, holds = describe_eval(mixed)
    assert not holds and "not every answer: 18 of 20 (minillm_arith_mc)" in text
    worse = _eval_numbers(served={("minillm_arith_mc", "acc,none"): 0.25, ("minillm_arith_mc", "acc_norm,none"): 0.75,
                                  ("minillm_arith_gen", "exact_match,strip"): 0.95})
    text, holds = describe_eval(worse)
    assert not holds and "The scores differ (minillm_arith_mc acc: 0.750 with hf, 0.250 through the server)" in text
    assert "acc_norm" not in text and "logs/chapter09-lm-eval.log" in text
