"""minillm/loadgen.py and `python -m minillm bench` against servers that misbehave: every request that
did not end in `data: [DONE]` without an error is a failure with its reason, a server that sends no
usage still gets its tokens counted, and the CLI checks its inputs before a run and keeps what a
sweep finished."""

import asyncio
import json

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from minillm.cli import main
from minillm.loadgen import RequestRecord, Slo, plot, prompts_from_text, run_load, summarize
from tests.test_server import _Server

TEXT = "a quick brown fox jumps over the lazy dog; " * 100  # 4,300 characters: enough for prompts of 512


def _chunk(text: str = "x", finish: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}) + "\n\n"


def _usage(tokens) -> str:
    return "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": tokens}}) + "\n\n"


STREAMS = {  # mode -> the SSE body the fake server sends
    "good": [_chunk("a"), _chunk("b"), _chunk("c", "length"), _usage(3), "data: [DONE]\n\n"],
    "no_usage": [_chunk("a"), _chunk("b"), "data: [DONE]\n\n"],
    "null_tokens": [_chunk("a"), _usage(None), "data: [DONE]\n\n"],
    "no_space": [_chunk("a").replace("data: ", "data:"), ": a comment\n\n", "data:[DONE]\n\n"],
    "empty": [_chunk("", "stop"), _usage(0), "data: [DONE]\n\n"],
    "error_in_stream": [_chunk("a"), 'data: {"error": {"message": "engine fell over"}}\n\n', "data: [DONE]\n\n"],
    "finish_error": [_chunk("a"), _chunk("", "error"), "data: [DONE]\n\n"],
    "truncated": [_chunk("a"), _chunk("b")],
    "not_json": [_chunk("a"), "data: {oops\n\n", "data: [DONE]\n\n"],
    "list": ["data: [1, 2, 3]\n\n", "data: [DONE]\n\n"],
}


def _fake_app() -> FastAPI:
    app = FastAPI()

    @app.post("/{mode}/v1/completions")
    async def completions(mode: str):
        if mode == "json":
            return JSONResponse({"choices": [{"text": "whole answer"}], "usage": {"completion_tokens": 2}})
        if mode == "hang":
            await asyncio.sleep(3600)

        async def events():
            for event in STREAMS[mode]:
                yield event
                await asyncio.sleep(0.01)

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def fake():
    server = _Server(_fake_app())
    yield server.url
    server.stop()


def _records(url: str, mode: str, count: int = 2, **kwargs) -> list[RequestRecord]:
    records, _ = asyncio.run(run_load(f"{url}/{mode}/v1", "m", ["hi"] * count, float("inf"), 4, progress=False,
                                      **kwargs))
    return records


@pytest.mark.parametrize("mode, tokens", [("good", 3), ("no_usage", 2), ("null_tokens", 1), ("no_space", 1),
                                          ("empty", 0)])
def test_a_finished_stream_counts_its_tokens(fake, mode, tokens):
    for record in _records(fake, mode):
        assert record.ok and record.error is None and record.output_tokens == tokens
        assert len(record.chunk_times) == tokens and (record.ttft is None) == (tokens == 0)


@pytest.mark.parametrize("mode, reason", [("error_in_stream", "engine fell over"), ("finish_error", "'error'"),
                                          ("truncated", "without data: [DONE]"), ("json", "not a stream"),
                                          ("not_json", "not JSON"), ("list", "not an object")])
def test_a_broken_stream_is_a_failure_with_its_reason(fake, mode, reason):
    records = _records(fake, mode)
    assert all(not r.ok and reason in r.error for r in records), [r.error for r in records]
    summary = summarize(records, 1.0, Slo())
    assert summary["completed"] == 0 and summary["goodput"] == 0 and reason in summary["errors"][0]


def test_a_server_that_never_answers_times_out(fake):
    records = _records(fake, "hang", request_timeout=0.5)
    assert all(r.error == "TimeoutError: no end after 0.5 s" for r in records)


def test_a_refused_connection_names_its_cause():
    record = _records("http://127.0.0.1:9", "good", count=1)[0]  # port 9: nothing listens
    assert not record.ok and record.error.startswith("ConnectError")


def test_goodput_checks_tpot_also_without_usage():
    slow = RequestRecord(0.0, [0.1, 0.6, 1.1], output_tokens=3, status=200, done=True)  # 500 ms a token
    assert slow.tpot == pytest.approx(0.5) and not Slo(ttft_s=1.0, tpot_s=0.1).met(slow)
    empty = RequestRecord(0.0, [], output_tokens=0, status=200, done=True)
    assert empty.ok and Slo().met(empty) and summarize([empty], 1.0, Slo())["ttft_s"]["p50"] is None


def test_the_plot_leaves_out_a_rate_where_everything_failed(tmp_path):
    failed = summarize([RequestRecord(0.0, status=500, error="HTTP 500")], 1.0, Slo())
    good = summarize([RequestRecord(0.0, [0.2, 0.3], 2, 200, done=True)], 1.0, Slo())
    plot([{"rate": 1.0} | good, {"rate": 2.0} | failed], tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_prompts_need_enough_text():
    assert len(set(prompts_from_text(TEXT, 20, seed=0))) == 20
    with pytest.raises(ValueError, match="needs at least 2,048"):
        prompts_from_text("hi", 3, seed=0)


def test_bench_checks_its_inputs_before_the_run(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("hi")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café ".encode("latin-1") * 1000)
    for args, message in ((["--prompts-file", str(short)], "needs at least"),
                          (["--prompts-file", str(latin)], "can't decode"),
                          (["--out", str(tmp_path / "missing" / "x")], "cannot write")):
        assert main(["bench", "--url", "http://127.0.0.1:9/v1", "--num-prompts", "1", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


def test_bench_saves_every_rate_and_fails_when_requests_fail(fake, tmp_path, capsys):
    out = tmp_path / "run.json"  # "run.json" names the files run.json and run.png
    assert main(["bench", "--url", f"{fake}/good/v1", "--num-prompts", "3", "--rate", "50", "inf",
                 "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert [r["rate"] for r in saved] == [50.0, "inf"] and all(r["completed"] == 3 for r in saved)
    assert (tmp_path / "run.png").exists() and f"wrote {tmp_path / 'run'}.json" in capsys.readouterr().out
    assert main(["bench", "--url", f"{fake}/truncated/v1", "--num-prompts", "2"]) == 1
    assert "2 of 2 requests failed" in capsys.readouterr().err


def test_an_interrupted_sweep_keeps_the_rates_it_finished(fake, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "sweep"
    bench = subprocess.Popen([sys.executable, "-m", "minillm", "bench", "--url", f"{fake}/good/v1", "--num-prompts",
                              "2", "--rate", "inf", "0.01", "--out", str(out)],  # the second rate: 100 s apart
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             # Ctrl-C as a terminal delivers it: a suite started in the background (`make test &`)
                             # passes SIGINT down ignored, and the bench would sleep through it
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    saved = out.with_suffix(".json")
    while time.time() < deadline and not (saved.exists() and json.loads(saved.read_text() or "[]")):
        time.sleep(0.2)
    time.sleep(0.5)
    bench.send_signal(signal.SIGINT)
    _, err = bench.communicate(timeout=30)
    assert bench.returncode == 130 and "interrupted: 1 of 2 rates finished" in err and "Traceback" not in err
    assert [r["rate"] for r in json.loads(out.with_suffix(".json").read_text())] == ["inf"]
