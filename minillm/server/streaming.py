"""A request's answer as server-sent events (chapter 9), as OpenAI streams it.

    data: {chunk: the role}                      chat only: {"delta": {"role": "assistant", "content": ""}}
    data: {chunk: a piece of text}               one per piece the engine produced
    data: {chunk: finish_reason}
    data: {"choices": [], "usage": {...}}        only when stream_options.include_usage is true
    data: [DONE]

With vLLM's stream_options.continuous_usage_stats every chunk also carries the usage so far. The
client leaving ends the stream where it is: the request is aborted (AsyncLLM) and counted as such.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from minillm.server.metrics import ServerMetrics
from minillm.server.protocol import GenerationRequest
from minillm.server.responses import FINISH, chunk, usage, usage_chunk


async def sse(answer_id: str, model: str, req: GenerationRequest, num_prompt_tokens: int, first: tuple,
              events: AsyncIterator, history: ServerMetrics) -> AsyncIterator[str]:
    """The events of one streamed request: `first` is the event already taken from `events`
    (AsyncLLM.stream_events' (delta, tokens so far, output or None) items)."""
    chat = req.messages is not None

    def event(data: dict) -> str:
        return f"data: {json.dumps(data)}\n\n"

    def so_far(generated: int) -> dict | None:
        return usage(num_prompt_tokens, generated) if req.continuous_usage else None

    recorded = False
    try:
        if chat:
            yield event(chunk(answer_id, model, chat, "", None, role=True, counts=so_far(0)))
        delta, generated, out = first
        while True:
            if out is not None:
                history.record(out)
                recorded = True
                generated = len(out.token_ids)
                yield event(chunk(answer_id, model, chat, None if chat else "", FINISH[out.finish_reason],
                                  counts=so_far(generated)))
                if req.include_usage:
                    yield event(usage_chunk(answer_id, model, chat, usage(num_prompt_tokens, generated)))
                yield "data: [DONE]\n\n"
                return
            if delta:
                yield event(chunk(answer_id, model, chat, delta, None, counts=so_far(generated)))
            delta, generated, out = await anext(events)
    finally:
        await events.aclose()  # a client gone mid-stream: the request is aborted there
        if not recorded:
            history.count_abort()
