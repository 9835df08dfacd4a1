"""The OpenAI API's response bodies (chapter 9): a whole answer, a streamed chunk, the usage, a model.

    {"id", "object": "text_completion" | "chat.completion", "created", "model", "choices": [...], "usage"}
    {"id", "object": "text_completion" | "chat.completion.chunk", ..., "choices": [one delta]}   streamed
    {..., "choices": [], "usage": {...}}        the last chunk, only when stream_options.include_usage
"""

from __future__ import annotations

import time

from minillm.engine import RequestOutput

FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def whole(answer_id: str, model: str, out: RequestOutput, chat: bool) -> dict:
    """The answer to a request that did not stream."""
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": out.text},
                  "finish_reason": FINISH[out.finish_reason], "logprobs": None}
    else:
        choice = {"index": 0, "text": out.text, "finish_reason": FINISH[out.finish_reason], "logprobs": None}
    return {"id": answer_id, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice],
            "usage": usage(len(out.prompt_token_ids), len(out.token_ids))}


def chunk(answer_id: str, model: str, chat: bool, text: str | None, finish: str | None, role: bool = False,
          counts: dict | None = None) -> dict:
    """One streamed chunk: a piece of text (chat: a delta, the first one with the role), or the finish
    reason; with `counts`, the usage so far (vLLM's continuous_usage_stats)."""
    if chat:
        delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
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
