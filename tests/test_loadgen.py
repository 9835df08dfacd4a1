"""minillm/loadgen.py and `python -m minillm bench` against servers that misbehave: every request that
did not end in `data: [DONE]` without an error, or carried no text, is a failure with its reason; output
tokens are counted from the stream and checked against the server's usage (absurd usage fails the
request, a usage below the count is reported and the count used); every read is bounded in bytes and
the run in time; and the CLI checks its inputs before a run and keeps what a sweep finished."""

import asyncio
import json
import os
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from minillm.cli import main
from minillm.loadgen import (
    RequestRecord,
    Slo,
    bounded_lines,
    plot,
    prompts_from_text,
    read_prompts_file,
    run_load,
    summarize,
)
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
    "merged": [_chunk("ab"), _chunk("cd", "length"), _usage(4), "data: [DONE]\n\n"],  # two tokens a chunk
    "crlf": [_chunk("a").replace("\n", "\r\n"), _chunk("b").replace("\n", "\r"), "data: [DONE]\r\n\r\n"],
    "big_chunk": [_chunk("y" * 200_000), "data: [DONE]\n\n"],  # long, but under the line limit
    "empty": [_chunk("", "stop"), _usage(0), "data: [DONE]\n\n"],
    "eos_first": [_chunk("", "stop"), _usage(1), "data: [DONE]\n\n"],  # a model that ends at once: a real answer
    "done_only": ["data: [DONE]\n\n"],
    "done_only_usage": [_usage(3), "data: [DONE]\n\n"],
    "negative_usage": [_chunk("a"), _usage(-132), "data: [DONE]\n\n"],
    "huge_usage": [_chunk("a"), _usage(4e31), "data: [DONE]\n\n"],
    "over_max_usage": [_chunk("a"), _usage(5), "data: [DONE]\n\n"],  # max_tokens is 4
    "string_usage": [_chunk("a"), _usage("3"), "data: [DONE]\n\n"],
    "bool_usage": [_chunk("a"), _usage(True), "data: [DONE]\n\n"],
    "usage_not_object": [_chunk("a"), 'data: {"choices": [], "usage": 7}\n\n', "data: [DONE]\n\n"],
    "low_usage": [_chunk("a"), _chunk("b"), _chunk("c"), _usage(1), "data: [DONE]\n\n"],
    "too_many_chunks": [_chunk("a")] * 5 + ["data: [DONE]\n\n"],
    "error_in_stream": [_chunk("a"), 'data: {"error": {"message": "engine fell over"}}\n\n', "data: [DONE]\n\n"],
    "finish_error": [_chunk("a"), _chunk("", "error"), "data: [DONE]\n\n"],
    "truncated": [_chunk("a"), _chunk("b")],
    "not_json": [_chunk("a"), "data: {oops\n\n", "data: [DONE]\n\n"],
    "list": ["data: [1, 2, 3]\n\n", "data: [DONE]\n\n"],
}


ENDLESS = {}  # mode -> whether the endless stream the fake server sent it has ended (the client closed it)


def _endless(mode: str, piece: bytes, pause: float = 0.0):
    """A response body that never ends: `piece` after `piece`, each `pause` seconds apart."""
    async def body():
        ENDLESS[mode] = False
        try:
            while True:
                yield piece
                await asyncio.sleep(pause)
        finally:
            ENDLESS[mode] = True
    return body()


def _fake_app() -> FastAPI:
    app = FastAPI()

    @app.post("/{mode}/v1/completions")
    async def completions(mode: str):
        if mode == "json":
            return JSONResponse({"choices": [{"text": "whole answer"}], "usage": {"completion_tokens": 2}})
        if mode == "http_error":
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "huge_line":  # "data: xxxx..." without an end of line, 64 KiB at a time
            return StreamingResponse(_endless(mode, b"data: " + b"x" * (64 << 10)), media_type="text/event-stream")
        if mode == "huge_error":
            return StreamingResponse(_endless(mode, b"e" * (64 << 10)), status_code=500)
        if mode == "dribble":  # a byte of a valid chunk every 20 ms, for ever
            return StreamingResponse(_endless(mode, b" ", 0.02), media_type="text/event-stream")
        if mode == "gzip":
            return StreamingResponse(iter([_chunk("a"), "data: [DONE]\n\n"]), media_type="text/event-stream",
                                     headers={"content-encoding": "gzip"})
        if mode == "long_line_ended":
            return StreamingResponse(iter([_chunk("z" * (2 << 20)), "data: [DONE]\n\n"]),
                                     media_type="text/event-stream")

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


@pytest.mark.parametrize("mode, tokens, chunks", [("good", 3, 3), ("no_usage", 2, 2), ("null_tokens", 1, 1),
                                                  ("no_space", 1, 1), ("merged", 4, 2), ("crlf", 2, 2),
                                                  ("big_chunk", 1, 1)])
def test_a_finished_stream_counts_its_tokens(fake, mode, tokens, chunks):
    """The chunks with text, or the server's usage where it is at least that (a chunk may hold several tokens)."""
    for record in _records(fake, mode):
        assert record.ok and record.error is None and record.warning is None and record.output_tokens == tokens
        assert len(record.chunk_times) == chunks and record.ttft is not None


def test_a_model_that_ends_at_once_is_a_finished_answer_without_a_first_token(fake):
    """EOS as the first token: no text to stream, a finished choice, a usage of one token — a success
    with no TTFT (a stream of only [DONE], or a usage of 0, stays a failure)."""
    for record in _records(fake, "eos_first"):
        assert record.ok and record.output_tokens == 1 and record.ttft is None and record.tpot is None


def test_a_usage_below_the_stream_is_reported_and_the_count_used(fake):
    records = _records(fake, "low_usage")
    assert all(r.ok and r.output_tokens == 3 and r.usage_tokens == 1 for r in records)
    summary = summarize(records, 1.0, Slo())
    assert summary["completed"] == 2 and summary["output_token_throughput"] == 6
    assert summary["errors"] == ["the server's usage says 1 completion tokens but its stream carried 3 chunks of "
                                 "text; counted 3"]


@pytest.mark.parametrize("mode, reason", [("error_in_stream", "engine fell over"), ("finish_error", "'error'"),
                                          ("truncated", "without data: [DONE]"), ("json", "not a stream"),
                                          ("not_json", "not JSON"), ("list", "not an object"),
                                          ("http_error", 'HTTP 503: {"error"'),
                                          ("empty", "no output token: the stream carried no text (its usage says 0"),
                                          ("done_only", "no output token: the stream carried no text"),
                                          ("done_only_usage", "no output token"),
                                          ("negative_usage", "completion_tokens is absurd: -132"),
                                          ("huge_usage", "completion_tokens is absurd: 4e+31"),
                                          ("over_max_usage", "absurd: 5 (an integer from 0 to max_tokens = 4"),
                                          ("string_usage", 'absurd: "3"'), ("bool_usage", "absurd: true"),
                                          ("usage_not_object", "usage is not an object: 7"),
                                          ("too_many_chunks", "more chunks of text than max_tokens = 4"),
                                          ("gzip", "content-encoding 'gzip'"),
                                          ("long_line_ended", "longer than 1,048,576 bytes")])
def test_a_broken_stream_is_a_failure_with_its_reason(fake, mode, reason):
    records = _records(fake, mode)
    assert all(not r.ok and reason in r.error for r in records), [r.error for r in records]
    summary = summarize(records, 1.0, Slo())
    assert summary["completed"] == 0 and summary["goodput"] == 0 and reason in summary["errors"][0]
    assert summary["output_token_throughput"] == 0


@pytest.mark.parametrize("mode, reason", [("huge_line", "a line of the stream is longer than 1,048,576 bytes"),
                                          ("huge_error", "HTTP 500: eee"),
                                          ("huge_error", "the error body is over 65,536 bytes; the rest was not read")])
def test_an_endless_body_fails_at_its_bound_and_is_closed(fake, mode, reason):
    """A line or an error body that never ends is read up to its bound, not buffered: the request fails
    long before its timeout, and the connection is closed (the server's endless body stops)."""
    import time

    began = time.perf_counter()
    record = _records(fake, mode, count=1, request_timeout=30)[0]
    assert not record.ok and reason in record.error and time.perf_counter() - began < 10, record.error
    deadline = time.time() + 10
    while not ENDLESS[mode] and time.time() < deadline:
        time.sleep(0.05)
    assert ENDLESS[mode], "the client left the connection open"


def test_a_dribbling_server_fails_at_the_request_timeout(fake):
    """A byte every 20 ms passes every read timeout; the request's own timeout still ends it."""
    import time

    began = time.perf_counter()
    records = _records(fake, "dribble", request_timeout=0.5)
    assert all(r.error == "TimeoutError: no end after 0.5 s" for r in records)
    assert time.perf_counter() - began < 5


def test_lines_are_split_at_every_kind_of_end_across_chunks():
    async def lines(pieces: list[bytes], limit: int = 8) -> list[str]:
        async def chunks():
            for piece in pieces:
                yield piece
        return [line async for line in bounded_lines(chunks(), limit)]

    assert asyncio.run(lines([b"ab\r", b"\ncd\re", b"f\n\ng\r"])) == ["ab", "cd", "ef", "", "g"]
    assert asyncio.run(lines([b"12345678\n", b"1234", b"5678"])) == ["12345678", "12345678"]  # at the limit
    for pieces in ([b"123456789\n"], [b"1234", b"56789"], [b"123456789"]):
        with pytest.raises(ValueError, match="longer than 8 bytes"):
            asyncio.run(lines(pieces))


def test_a_server_that_never_answers_times_out(fake):
    records = _records(fake, "hang", request_timeout=0.5)
    assert all(r.error == "TimeoutError: no end after 0.5 s" for r in records)


def test_a_refused_connection_names_its_cause():
    record = _records("http://127.0.0.1:9", "good", count=1)[0]  # port 9: nothing listens
    assert not record.ok and record.error.startswith("ConnectError")


def test_goodput_checks_tpot_also_without_usage():
    slow = RequestRecord(0.0, [0.1, 0.6, 1.1], output_tokens=3, status=200, done=True)  # 500 ms a token
    assert slow.tpot == pytest.approx(0.5) and not Slo(ttft_s=1.0, tpot_s=0.1).met(slow)
    empty = RequestRecord(0.0, [], output_tokens=0, status=200, done=True)  # no token: not a success
    assert not empty.ok and not Slo().met(empty) and summarize([empty], 1.0, Slo())["ttft_s"]["p50"] is None


def test_arrivals_after_the_duration_are_not_sent(fake):
    """--rate 1e-9 plans the second arrival decades away: it is not sent, and the run ends at once."""
    import time

    began = time.perf_counter()
    records, wall = asyncio.run(run_load(f"{fake}/good/v1", "m", ["hi"] * 3, 1e-9, 4, progress=False,
                                         request_timeout=5.0))
    assert time.perf_counter() - began < 5 and wall < 5
    assert records[0].ok and all(r.not_sent and r.status is None for r in records[1:])
    summary = summarize(records, wall, Slo())
    assert (summary["requests"], summary["not_sent"], summary["completed"], summary["failed"]) == (1, 2, 1, 0)
    records, _ = asyncio.run(run_load(f"{fake}/good/v1", "m", ["hi"] * 40, 20.0, 4, progress=False, duration=0.5))
    assert all(r.ok for r in records if not r.not_sent) and 0 < sum(r.not_sent for r in records) < 40
    assert all(r.sent > 0.5 for r in records if r.not_sent)


def test_the_prompts_file_must_be_a_small_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it to read would wait for a writer for ever
    for path in (fifo, tmp_path, Path("/dev/zero")):
        with pytest.raises(ValueError, match="not a regular file"):
            read_prompts_file(path)
    (tmp_path / "big.txt").write_text("x" * 101)
    with pytest.raises(ValueError, match="101 bytes; at most 100"):
        read_prompts_file(tmp_path / "big.txt", max_bytes=100)
    assert read_prompts_file(tmp_path / "big.txt") == "x" * 101


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
                          (["--prompts-file", str(tmp_path)], "not a regular file"),
                          (["--prompts-file", str(tmp_path / "absent.txt")], "No such file"),
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


def test_bench_over_a_fifo_refuses_it_at_once(tmp_path, capsys):
    fifo = tmp_path / "prompts"
    os.mkfifo(fifo)
    assert main(["bench", "--url", "http://127.0.0.1:9/v1", "--prompts-file", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--prompts-file {fifo}: not a regular file" in err


@pytest.mark.parametrize("mode", ["done_only", "negative_usage", "huge_usage"])
def test_bench_scores_no_goodput_for_a_server_that_lies(fake, capsys, mode):
    """The review's cases: [DONE] alone scored 3/3 ok; usage -132 or 4e31 gave -132 or 4e31 tok/s."""
    assert main(["bench", "--url", f"{fake}/{mode}/v1", "--num-prompts", "3", "--max-tokens", "4"]) == 1
    out, err = capsys.readouterr()
    assert "0/3 ok, 0.00 req/s, 0 tok/s, goodput 0.00 req/s" in out and "  error: " in out
    assert "3 of 3 requests failed" in err


def test_bench_names_both_counts_when_usage_disagrees(fake, capsys):
    assert main(["bench", "--url", f"{fake}/low_usage/v1", "--num-prompts", "2", "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "2/2 ok" in out and "  error: the server's usage says 1 completion tokens but its stream carried 3" in out


def test_bench_at_a_vanishing_rate_ends_within_its_duration(fake, capsys):
    import time

    began = time.perf_counter()
    assert main(["bench", "--url", f"{fake}/good/v1", "--num-prompts", "3", "--rate", "1e-9",
                 "--request-timeout", "5"]) == 0
    assert time.perf_counter() - began < 10
    out = capsys.readouterr().out
    assert "1/1 ok" in out and "not sent: 2 of 3 requests, whose arrivals fell after the run's 5 s (--duration)" in out
