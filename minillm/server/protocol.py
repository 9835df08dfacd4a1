"""The OpenAI API's request bodies, checked and turned into the engine's terms (chapter 9).

    POST /v1/completions       {"model", "prompt": str | [token ids], "max_tokens", "temperature", "top_p",
                                "top_k", "seed", "stop", "n": 1, "stream"}
    POST /v1/chat/completions  {"model", "messages": [{"role", "content"}], ...the same sampling fields}
                               and, as vLLM accepts it, "ignore_eos" (generate exactly max_tokens)

Everything a body brings is checked here, before the engine sees it: a bad field is a
`RequestError` (HTTP 400, OpenAI's error shape, naming the field), never a failure inside a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minillm.sampling import SamplingParams, is_int

MAX_STOP_STRINGS = 4
UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "best_of", "suffix", "tools", "functions", "logit_bias",
               "response_format")


class RequestError(Exception):
    """A request the server refuses: its HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass(frozen=True)
class GenerationRequest:
    """One checked request: what to generate from, how, and how to answer."""

    model: str
    prompt: str | list[int] | None  # completions
    messages: list[dict] | None  # chat
    params: SamplingParams
    stream: bool
    include_usage: bool  # streaming: a last chunk with the token counts


def _bad(message: str, param: str) -> RequestError:
    return RequestError(400, message, param)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not low <= value <= high:
        raise _bad(f"{name} must be a number in [{low}, {high}], got {value!r}", name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise _bad(f"{name} must be an integer {bound}, got {value!r}", name)
    return int(value)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false, got {value!r}", name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > MAX_STOP_STRINGS:
        raise _bad(f"stop must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them, got {stop!r}",
                   "stop")
    return tuple(stops)


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant") \
                or not isinstance(message.get("content"), str):
            raise _bad(f"messages[{i}] must be {{'role': 'system' | 'user' | 'assistant', 'content': str}}, got "
                       f"{message!r}", "messages")
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(is_int(t) and t >= 0 for t in prompt):
        return [int(t) for t in prompt]
    raise _bad("prompt must be a non-empty string or a list of token ids (one prompt per request)", "prompt")


def parse(body: object, chat: bool, default_max_tokens: int) -> GenerationRequest:
    """A completions (or, with `chat`, a chat completions) body -> GenerationRequest, or RequestError."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model must be the name of a served model (GET /v1/models lists them)", "model")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, 0, [], {}):
            raise _bad(f"{name} is not supported by this server", name)
    if _integer(body, "n", 1, 1) != 1:
        raise _bad("n must be 1: this server returns one choice per request", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options must be an object", "stream_options")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise _bad("top_p must be in (0, 1], got 0", "top_p")
    top_k = _integer(body, "top_k", None, -1)
    max_tokens = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    try:
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=None if top_k in (None, -1, 0) else top_k,
                                max_new_tokens=_integer(body, max_tokens, default_max_tokens, 1),
                                seed=_integer(body, "seed", None, 0, 2**63 - 1), stop=_stop(body),
                                ignore_eos=_flag(body, "ignore_eos"))
    except ValueError as err:  # the engine's own checks, for anything the lines above let through
        raise _bad(str(err), None) from None
    return GenerationRequest(model, None if chat else _prompt(body), _messages(body) if chat else None, params,
                             stream, bool((options or {}).get("include_usage", True)))
