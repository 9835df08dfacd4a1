"""The engine core in a process of its own (chapter 10), as vLLM v1 and SGLang split a server.

    front end (the server's process)                          engine core (its own process)
    HTTP, tokenizing ─── AddRequest(ids, params) ─────────►   a busy loop: take messages,
    detokenizing,    ─── AbortRequest / StopSample ───────►   schedule, forward, sample
    stop strings     ◄── CoreStep(token ids per sample) ───   (LLMEngine, detokenize=False)

    messages.py          what crosses the boundary: token ids and finish reasons, never text
    core.py              the core process: its loop, and how it ends when its front end is gone
    output_processor.py  the front end's half of a request: text, stop strings, its output
    client.py            ProcessAsyncLLM: AsyncLLM's API over a core in another process

What each side did, span by span, is recorded when asked by minillm/timeline.py (chapter 10's timeline),
which the in-process AsyncLLM uses too.
"""

from minillm.engine_core.client import ProcessAsyncLLM

__all__ = ["ProcessAsyncLLM"]
