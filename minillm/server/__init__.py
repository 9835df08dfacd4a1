"""The OpenAI-compatible server (chapter 9): `python -m minillm serve`, or `build_app` in code.

    protocol.py       request bodies checked and turned into SamplingParams; the field policy; OpenAI's error shape
    structured_fields.py  response_format and vLLM's structured_outputs -> one StructuredOutput (chapter 11)
    tools.py          tools and tool_choice: a function's arguments as a constraint, the answer's tool_calls
    grammar_check.py  a request's constraint compiled before it is queued: what the library refuses is a 400
    body.py           request bodies read with a bound (413) and parsed off the event loop
    parse_worker.py   the helper process that parses large bodies (their parse holds no lock the engine needs)
    chat_template.py  chat messages -> one prompt (the checkpoint's template, or a plain transcript)
    responses.py      OpenAI's response bodies: a whole answer, a chunk, the usage, a model
    streaming.py      a request's answer as server-sent events
    metrics.py        GET /metrics: engine gauges, counters and latency histograms, Prometheus' text format
    app.py            the FastAPI routes over AsyncLLM: completions, chat, streaming, tokenize, models, health
"""

from minillm.server.app import build_app

__all__ = ["build_app"]
