"""The OpenAI-compatible server (chapter 9): `python -m minillm serve`, or `build_app` in code.

    protocol.py       request bodies checked and turned into SamplingParams; OpenAI's error shape
    chat_template.py  chat messages -> one prompt
    metrics.py        GET /metrics: engine gauges, counters and latency histograms, Prometheus' text format
    app.py            the FastAPI routes over AsyncLLM: completions, chat, streaming, models, health, metrics
"""

from minillm.server.app import build_app

__all__ = ["build_app"]
