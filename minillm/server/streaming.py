"""A request's answer as server-sent events (chapter 9), as OpenAI streams it.

    data: {chunk: the role}                      chat only, once per sample: {"delta": {"role": "assistant", ...}}
    data: {chunk: the prompt}                    completions with echo, once per sample
    data: {chunk: a piece of text}               one per step that gave a sample text (or, with logprobs,
                                                 tokens whose text is still held back), with its "index";
                                                 a chat that must call a function: pieces of its tool_calls
                                                 instead (minillm/server/tools.py)
    data: {chunk: finish_reason}                 once per sample, when it ends ("stop" or "length")
    data: {"choices": [], "usage": {...}}        only when stream_options.include_usage is true
    data: [DONE]

A request that fails in the engine (or is aborted) mid-stream ends with OpenAI's error object,
data: {"error": {"message", "type", "param", "code"}}, then data: [DONE] — its HTTP status was already
200. Text offsets in streamed logprobs count the tokens' texts, as the whole answer's do.

With vLLM's stream_options.continuous_usage_stats every chunk also carries the usage so far. The
client leaving ends the stream where it is: the request is aborted (AsyncLLM) and counted as such.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from minillm.async_engine import StreamEvent
from minillm.server.logprob_format import LogprobFormatter
from minillm.server.metrics import ServerMetrics
from minillm.server.protocol import GenerationRequest
from minillm.server.responses import FINISH, chunk, completion_tokens, usage, usage_chunk
from minillm.server.tools import CallStream


async def sse(answer_id: str, model: str, req: GenerationRequest, prompt_ids: list[int], prompt_text: str,
              first: StreamEvent, events: AsyncIterator[StreamEvent], history: ServerMetrics,
              formatter: LogprobFormatter) -> AsyncIterator[str]:
    """The events of one streamed request: `first` is the event already taken from `events`
    (AsyncLLM.stream_events)."""
    chat = req.messages is not None
    samples = range(req.params.n)
    offsets = dict.fromkeys(samples, 0)  # each sample's next text offset: its tokens' texts so far, as unstreamed
    finished: set[int] = set()
    calls = {i: CallStream(req.tools) for i in samples} if req.tools is not None else None  # text -> tool calls

    def finish(index: int, reason: str) -> str:
        reason = "length" if req.prompt_only else FINISH[reason]
        return calls[index].calling.finish_reason(reason) if calls is not None else reason

    def event(data: dict) -> str:
        return f"data: {json.dumps(data)}\n\n"

    def so_far(generated: int) -> dict | None:
        return usage(len(prompt_ids), 0 if req.prompt_only else generated) if req.continuous_usage else None

    def logprobs(index: int, token_ids, entries) -> dict | None:
        if req.logprobs is None:
            return None
        if chat:
            return formatter.chat(entries, req.logprobs)
        shaped = formatter.completion(token_ids, entries, req.logprobs, text_offset=offsets[index])
        offsets[index] += sum(len(token) for token in shaped["tokens"])
        return shaped

    recorded = False
    try:
        entries = first.prompt_logprobs or (first.output.prompt_logprobs if first.output is not None else None)
        for i in samples:
            if chat:  # with the role: a named tool call's id and name
                yield event(chunk(answer_id, model, chat, "" if calls is None else None, None, role=True,
                                  counts=so_far(0), index=i, tool_calls=calls[i].start() if calls else None))
            elif req.echo:  # the prompt first, as the answer's beginning (its logprobs are known by now)
                given = list(entries or ())
                shaped = logprobs(i, prompt_ids, given + [None] * (len(prompt_ids) - len(given)))
                yield event(chunk(answer_id, model, chat, prompt_text, None, counts=so_far(0), index=i,
                                  logprobs=shaped))
        e = first
        while e.output is None:
            called = calls[e.index].push(e.delta) if calls is not None else None
            if not req.prompt_only and (called or (e.delta and calls is None)
                                        or (e.token_ids and req.logprobs is not None)):
                text = e.delta if (e.delta or not chat) and calls is None else None
                yield event(chunk(answer_id, model, chat, text, None, counts=so_far(e.generated), index=e.index,
                                  logprobs=logprobs(e.index, e.token_ids, e.logprobs), tool_calls=called))
            if e.finish_reason in ("stop", "length"):  # an error or an abort is said once, at the end
                finished.add(e.index)
                yield event(chunk(answer_id, model, chat, None if chat else "", finish(e.index, e.finish_reason),
                                  counts=so_far(e.generated), index=e.index))
            e = await anext(events)
        out = e.output
        history.record(out)
        recorded = True
        generated = completion_tokens(out, req)
        if out.finish_reason in ("error", "abort"):  # OpenAI's way: an error object in the stream, then [DONE]
            why = out.error if out.finish_reason == "error" else "the request was aborted"
            yield event({"error": {"message": f"the request failed in the engine: {why}", "type": "server_error",
                                   "param": None, "code": None}})
            yield "data: [DONE]\n\n"
            return
        for sample in out.outputs:  # the samples that ended without a step saying so
            if sample.index not in finished:
                yield event(chunk(answer_id, model, chat, None if chat else "", finish(sample.index,
                                                                                       sample.finish_reason),
                                  counts=so_far(generated), index=sample.index))
        if req.include_usage:
            yield event(usage_chunk(answer_id, model, chat, usage(len(prompt_ids), generated)))
        yield "data: [DONE]\n\n"
    finally:
        await events.aclose()  # a client gone mid-stream: the request is aborted there
        if not recorded:
            history.count_abort()
