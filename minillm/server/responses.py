"""The OpenAI API's response bodies (chapter 9): a whole answer, a streamed chunk, the usage, a model.

    {"id", "object": "text_completion" | "chat.completion", "created", "model", "choices": [...], "usage"}
    {"id", "object": "text_completion" | "chat.completion.chunk", ..., "choices": [one delta]}   streamed
    {..., "choices": [], "usage": {...}}        the last chunk, only when stream_options.include_usage

One choice per sample (`n`), each with its `index`. A chat that must call a function answers with
the message's `tool_calls` (minillm/server/tools.py) and null content. Completions with `echo` give
the prompt back before the answer (with `logprobs`, its tokens' too, the first one's null); with
`max_tokens: 0` the prompt alone. Logprobs are written by minillm/server/logprob_format.py.
"""

from __future__ import annotations

import time

from minillm.engine import CompletionOutput, RequestOutput
from minillm.server.logprob_format import LogprobFormatter
from minillm.server.protocol import GenerationRequest
from minillm.server.tools import tool_calls

FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_tokens(out: RequestOutput, req: GenerationRequest) -> int:
    """Tokens generated for the answer, every sample counted (none when only the prompt was asked for)."""
    return 0 if req.prompt_only else sum(len(o.token_ids) for o in out.outputs)


def whole(answer_id: str, model: str, out: RequestOutput, req: GenerationRequest, formatter: LogprobFormatter,
          prompt_text: str) -> dict:
    """The answer to a request that did not stream."""
    chat = req.messages is not None
    choices = [_chat_choice(o, req, formatter) if chat else _completion_choice(o, out, req, formatter, prompt_text)
               for o in out.outputs]
    body = {"id": answer_id, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": choices,
            "usage": usage(len(out.prompt_token_ids), completion_tokens(out, req))}
    if chat and req.prompt_logprobs is not None:  # vLLM puts a chat's beside its choices
        body["prompt_logprobs"] = formatter.prompt_logprobs(out.prompt_token_ids, out.prompt_logprobs,
                                                            req.prompt_logprobs)
    return body


def _completion_choice(sample: CompletionOutput, out: RequestOutput, req: GenerationRequest,
                       formatter: LogprobFormatter, prompt_text: str) -> dict:
    token_ids = [] if req.prompt_only else list(sample.token_ids)
    entries = [] if req.prompt_only else list(sample.logprobs or ())
    if req.echo:
        token_ids, entries = out.prompt_token_ids + token_ids, list(out.prompt_logprobs or ()) + entries
    text = (prompt_text if req.echo else "") + ("" if req.prompt_only else sample.text)
    logprobs = formatter.completion(token_ids, entries, req.logprobs) if req.logprobs is not None else None
    choice = {"index": sample.index, "text": text, "logprobs": logprobs,
              "finish_reason": "length" if req.prompt_only else FINISH[sample.finish_reason]}
    if req.prompt_logprobs is not None:
        choice["prompt_logprobs"] = formatter.prompt_logprobs(out.prompt_token_ids, out.prompt_logprobs,
                                                              req.prompt_logprobs)
    return choice


def _chat_choice(sample: CompletionOutput, req: GenerationRequest, formatter: LogprobFormatter) -> dict:
    logprobs = formatter.chat(sample.logprobs or (), req.logprobs) if req.logprobs is not None else None
    message = {"role": "assistant", "content": sample.text}
    finish = FINISH[sample.finish_reason]
    if req.tools is not None:  # the text is the call's arguments (minillm/server/tools.py)
        message = {"role": "assistant", "content": None, "tool_calls": tool_calls(req.tools, sample.text)}
        finish = req.tools.finish_reason(finish)
    return {"index": sample.index, "message": message, "logprobs": logprobs, "finish_reason": finish}


def chunk(answer_id: str, model: str, chat: bool, text: str | None, finish: str | None, role: bool = False,
          counts: dict | None = None, index: int = 0, logprobs: dict | None = None,
          tool_calls: list[dict] | None = None) -> dict:
    """One streamed chunk of sample `index`: a piece of text (chat: a delta, the first one with the
    role; or pieces of tool calls) and its tokens' logprobs, or the finish reason; with `counts`, the
    usage so far (vLLM's continuous_usage_stats)."""
    if chat:
        delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text is not None else {}) \
            | ({"tool_calls": tool_calls} if tool_calls else {})
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
    body = {"id": answer_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}
    return body | ({"usage": counts} if counts is not None else {})


def usage_chunk(answer_id: str, model: str, chat: bool, counts: dict) -> dict:
    """The stream's last chunk before [DONE] when the client asked for the usage: no choices."""
    return {"id": answer_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [], "usage": counts}


def model_card(model: str, created: int, max_model_len: int) -> dict:
    """GET /v1/models' entry (and GET /v1/models/{id}): OpenAI's fields, and vLLM's max_model_len."""
    return {"id": model, "object": "model", "created": created, "owned_by": "minillm", "max_model_len": max_model_len}
