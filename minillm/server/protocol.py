"""The OpenAI API's request bodies, checked and turned into the engine's terms (chapter 9).

    POST /v1/completions       {"model", "prompt": str | [token ids], "max_tokens", "temperature", ...}
    POST /v1/chat/completions  {"model", "messages": [{"role", "content", ...}], ...}
    POST /tokenize             {"model"?, "prompt" | "messages", "add_special_tokens", ...}  (vLLM's)
    POST /detokenize           {"model"?, "tokens": [token ids]}                            (vLLM's)

Everything a body brings is checked here, before the engine sees it: a bad field is a
`RequestError` (HTTP 400, OpenAI's error shape, naming the field), never a failure inside a step.

**Field policy: we refuse rather than ignore**, so that a client never believes a parameter took
effect when it did not. Every field an endpoint knows is in exactly one of these groups:

    applied     the server or the engine acts on it: every sampling field    APPLIED_*
                OpenAI and vLLM clients send (n, logprobs, echo, penalties,
                logit_bias, min_p, min_tokens, stop_token_ids, ...), and
                structured outputs: response_format, structured_outputs,
                chat's tools, tool_choice, parallel_tool_calls
                (minillm/server/structured_fields.py, tools.py)
    not yet     accepted only at its neutral value until it is applied        NOT_YET_APPLIED, and
                (today only vLLM's chat "echo")                               chat's "echo"
    replaced    vLLM's removed guided_json, guided_regex, guided_choice,      REPLACED
                guided_grammar: accepted only when null, otherwise a 400
                that points at structured_outputs
    later       other modalities, predicted outputs and the like, and the     LATER_*
                tool fields on completions: accepted only at neutral
    metadata    accepted, and it does not change what is generated           METADATA

A neutral value is one that asks for nothing. Any other field is refused with a 400 naming it.
Ranges are vLLM's (minillm/sampling.py checks them again): n in [1, 128] (and at most the engine's
max_num_seqs), logprobs and top_logprobs in [0, 20], penalties in [-2, 2] (repetition in (0, 2]),
logit_bias values in [-100, 100] on token ids of the vocabulary. `max_tokens: 0` is allowed with
`echo` only: the prompt and its logprobs come back, nothing is generated. A structured output
decides where the output ends, so min_tokens and ignore_eos cannot come with one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from minillm.sampling import MAX_LOGIT_BIAS, MAX_LOGPROBS, SamplingParams, is_int
from minillm.server.structured_fields import ConstraintError, requested
from minillm.server.tools import ToolCalling

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_STOP_TOKEN_IDS = 1024  # each is compared with every new token: a bound keeps a step cheap


class RequestError(Exception):
    """A request the server refuses: its HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def __reduce__(self):  # pickled whole: a body checked in body.py's helper process raises it here
        return RequestError, (self.status, self.message, self.param, self.kind, self.code)


def _bad(message: str, param: str | None) -> RequestError:
    return RequestError(400, message, param)


# ----------------------------------------------------------------------------------------------- the policy
Neutral = Callable[[object], bool]


def _null_or(*values: object) -> Neutral:
    """Neutral when null or one of `values`, of the same JSON type (0 is not false, 1 is not true)."""
    return lambda v: v is None or any(type(v) is type(n) and v == n for n in values)


def _null_or_number(value: float) -> Neutral:
    """Neutral when null or the number `value`, written as an integer or not (0 and 0.0)."""
    return lambda v: v is None or (isinstance(v, int | float) and not isinstance(v, bool) and v == value)


# field -> (its neutral values, in words; the test). Fields the engine does not apply yet would go here:
# accepted only at their neutral value until they are. Every sampling field clients send is applied now.
NOT_YET_APPLIED: dict[str, tuple[str, Neutral]] = {}
# vLLM's chat "echo" (prepend the last message to the answer) is not applied: accepted only when false
_CHAT_NOT_YET = NOT_YET_APPLIED | {"echo": ("false", _null_or(False))}

# vLLM removed these (its 0.32 ignores them, with a warning): refused, pointing at what replaced them
REPLACED: dict[str, tuple[str, Neutral]] = {name: ("null", _null_or()) for name in (
    "guided_json", "guided_regex", "guided_choice", "guided_grammar")}

# other modalities, predicted outputs and the like: a later chapter. Accepted only at neutral.
LATER_BOTH: dict[str, tuple[str, Neutral]] = {}
LATER_COMPLETIONS = LATER_BOTH | {
    "best_of": ("1", _null_or(1)),
    "suffix": ('""', _null_or("")),
    "tools": ("null or []", _null_or([])),  # tools are chat's
    "tool_choice": ('"none"', _null_or("none")),
    "parallel_tool_calls": ("null", _null_or()),
}
LATER_CHAT = LATER_BOTH | {
    "functions": ("null or []", _null_or([])),
    "function_call": ('"none"', _null_or("none")),
    "audio": ("null", _null_or()),
    "modalities": ('["text"]', _null_or(["text"])),
    "prediction": ("null", _null_or()),
    "reasoning_effort": ("null", _null_or()),
    "web_search_options": ("null", _null_or()),
    "chat_template": ("null", _null_or()),
    "chat_template_kwargs": ("null or {}", _null_or({})),
    "documents": ("null", _null_or()),
}

# accepted, recorded nowhere, and they do not change what is generated: name -> its JSON type
METADATA: dict[str, type | tuple[type, ...]] = {
    "user": str, "metadata": dict, "store": bool, "service_tier": str, "safety_identifier": str,
    "prompt_cache_key": str,
}

_SAMPLING = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
             "ignore_eos", "stream", "stream_options", "add_special_tokens", "n", "presence_penalty",
             "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "include_stop_str_in_output",
             "skip_special_tokens", "prompt_logprobs", "logprobs"}
_STRUCTURED = {"response_format", "structured_outputs"}
APPLIED_COMPLETIONS = _SAMPLING | _STRUCTURED | {"prompt", "echo"}
APPLIED_CHAT = _SAMPLING | _STRUCTURED | {"messages", "max_completion_tokens", "add_generation_prompt",
                                          "continue_final_message", "top_logprobs", "tools", "tool_choice",
                                          "parallel_tool_calls"}
MAX_N = 128  # samples per request (the engine also needs a batch slot for each: max_num_seqs)


def max_list_items(max_model_len: int | None) -> int:
    """The most entries any list or object of a usable request has (a prompt's token ids, stop_token_ids,
    logit_bias): the body reader refuses longer ones before parsing them, and the checks here agree."""
    return max(max_model_len or 0, MAX_STOP_TOKEN_IDS)
APPLIED_TOKENIZE = {"model", "prompt", "add_special_tokens", "return_token_strs"}
APPLIED_TOKENIZE_CHAT = {"model", "messages", "add_special_tokens", "return_token_strs", "add_generation_prompt",
                         "continue_final_message"}
LATER_TOKENIZE_CHAT = {name: LATER_CHAT[name] for name in ("chat_template", "chat_template_kwargs")} | {
    "tools": ("null or []", _null_or([])), "mm_processor_kwargs": ("null", _null_or())}
APPLIED_DETOKENIZE = {"model", "tokens"}


def check_fields(body: dict, applied: set[str], neutral_only: dict[str, tuple[str, Neutral]],
                 metadata: dict[str, type | tuple[type, ...]]) -> None:
    """Refuse any field that is unknown, or known but set to a value this server would not honour."""
    unknown = [name for name in body if name not in applied and name not in neutral_only and name not in metadata]
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise _bad(f"unknown field{'s' if len(unknown) > 1 else ''} {names}: this server refuses fields it does not "
                   "know rather than ignore them", str(unknown[0]))
    for name, (words, is_neutral) in neutral_only.items():
        if name in body and not is_neutral(body[name]):
            if name in REPLACED:
                kind = name.removeprefix("guided_")
                raise _bad(f"{name} is not supported by this server: vLLM replaced it with structured_outputs; send "
                           f'"structured_outputs": {{"{kind}": ...}} (in the openai SDK: extra_body)', name)
            why = " yet" if name in NOT_YET_APPLIED or name == "echo" else ""
            raise _bad(f"{name} is not supported by this server{why}: {name} must be {words} or left out, got "
                       f"{_short(body[name])}", name)
    for name, kind in metadata.items():
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise _bad(f"{name} must be a {kind.__name__ if isinstance(kind, type) else kind}, got "
                       f"{_short(body[name])}", name)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ----------------------------------------------------------------------------------------------- values
def _real(value: object) -> bool:
    """A JSON number that is a finite real: an int of any size (compared exactly, never overflowing a
    float), or a finite float; not a bool."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if not _real(value) or not low <= value <= high:
        raise _bad(f"{name} must be a number in [{low}, {high}], got {_short(value)}", name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise _bad(f"{name} must be an integer {bound}, got {_short(value)}", name)
    return int(value)


def _flag(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false, got {_short(value)}", name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > MAX_STOP_STRINGS:
        raise _bad(f"stop must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them, got "
                   f"{_short(stop)}", "stop")
    return tuple(stops)


def _token_ids(body: dict, name: str, vocab_size: int | None, most: int | None = None) -> list[int]:
    """A list of token ids in [0, vocab_size) (at most `most` of them), or a 400 naming `name`."""
    ids = body.get(name)
    bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
    if not isinstance(ids, list):
        raise _bad(f"{name} must be a list of token ids in {bound}, got {_short(ids)}", name)
    if most is not None and len(ids) > most:
        raise _bad(f"{name} has {len(ids)} ids, more than the {most} this server takes", name)
    for i, token in enumerate(ids):
        if not is_int(token) or token < 0 or (vocab_size is not None and token >= vocab_size):
            raise _bad(f"{name}[{i}] must be a token id in {bound}, got {_short(token)}", name)
    return [int(t) for t in ids]


def _logit_bias(body: dict, vocab_size: int | None, max_items: int) -> dict[int, float]:
    """OpenAI's logit_bias: {"<token id>": bias in [-100, 100]} (JSON keys are strings, so a token is
    written once: "5", never also "05"), at most `max_items` entries."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise _bad(f"logit_bias must be an object mapping token ids to numbers, got {_short(bias)}", "logit_bias")
    if len(bias) > max_items:
        raise _bad(f"logit_bias has {len(bias)} entries, more than the {max_items} this server takes", "logit_bias")
    checked = {}
    bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
    for key, value in bias.items():  # a token id written in decimal, no sign, no leading zero, no digit soup
        canonical = isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12 \
            and (key == "0" or not key.startswith("0"))
        token = int(key) if canonical else None
        if token is None or (vocab_size is not None and token >= vocab_size):
            raise _bad(f"logit_bias key {_short(key)} must be a token id in {bound}, written in decimal", "logit_bias")
        if not _real(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise _bad(f"logit_bias[{key!r}] must be a number in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got "
                       f"{_short(value)}", "logit_bias")
        checked[token] = float(value)
    return checked


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives per generated token to report (None: no logprobs). Completions: `logprobs`
    is that number (0: the chosen token's alone); chat: `logprobs` is true or false, `top_logprobs` the
    number (it needs logprobs: true)."""
    if not chat:
        return _integer(body, "logprobs", None, 0, MAX_LOGPROBS)
    wanted = _flag(body, "logprobs")
    top = _integer(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if wanted else None


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats): a last chunk with the usage; the usage on every chunk (vLLM's)."""
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not stream:
        raise _bad("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(options, dict):
        raise _bad(f"stream_options must be an object, got {_short(options)}", "stream_options")
    unknown = [k for k in options if k not in ("include_usage", "continuous_usage_stats")]
    if unknown:
        raise _bad(f"stream_options.{unknown[0]} is not supported by this server (it knows include_usage and "
                   "continuous_usage_stats)", "stream_options")
    for name in ("include_usage", "continuous_usage_stats"):
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise _bad(f"stream_options.{name} must be true or false, got {_short(options[name])}", "stream_options")
    include, continuous = (bool(options.get(k)) for k in ("include_usage", "continuous_usage_stats"))
    if continuous and not include:
        raise _bad("stream_options.continuous_usage_stats needs stream_options.include_usage: true",
                   "stream_options")
    return include, continuous


# ----------------------------------------------------------------------------------------------- chat messages
ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_NEUTRAL = {"refusal": _null_or(), "audio": _null_or(), "function_call": _null_or(),
                    "annotations": _null_or([])}  # what an SDK's echo of an earlier answer carries


def _text(content: object, where: str, may_be_null: bool) -> str | None:
    """A message's content: a string, or a list of text parts (joined by newlines); null only where allowed."""
    if content is None and may_be_null:
        return None
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of text parts, got {_short(content)}", "messages")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            if isinstance(kind, str):
                raise _bad(f"{where}.content[{j}] is a {kind!r} part: this server takes text parts only", "messages")
            raise _bad(f"{where}.content[{j}] must be {{'type': 'text', 'text': str}}, got {_short(part)}",
                       "messages")
        if not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
            raise _bad(f"{where}.content[{j}] must be {{'type': 'text', 'text': str}}, got {_short(part)}",
                       "messages")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_calls(calls: object, where: str) -> list[dict]:
    if not isinstance(calls, list) or not calls:
        raise _bad(f"{where}.tool_calls must be a non-empty list", "messages")
    checked = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(call, dict) and isinstance(call.get("id"), str)
                and call.get("type", "function") == "function" and set(call) <= {"id", "type", "function"}
                and isinstance(function, dict)
                and isinstance(function.get("name"), str) and isinstance(function.get("arguments"), str)
                and set(function) <= {"name", "arguments"}):
            raise _bad(f"{where}.tool_calls[{j}] must be {{'id': str, 'type': 'function', 'function': {{'name': str, "
                       f"'arguments': str}}}}, got {_short(call)}", "messages")
        checked.append({"id": call["id"], "type": "function",
                        "function": {"name": function["name"], "arguments": function["arguments"]}})
    return checked


def _message(message: object, i: int) -> dict:
    """One checked message, as a chat template receives it: `developer` becomes `system` (as OpenAI
    treats it), text parts are joined into one string; tool calls, tool_call_id and name are kept."""
    where = f"messages[{i}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        role = message.get("role") if isinstance(message, dict) else None
        raise _bad(f"{where} must be an object with a role in {', '.join(ROLES)}, got role {_short(role)}",
                   "messages")
    role = message["role"]
    known = {"role", "content", "name"} | {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}.get(role, set())
    for key, value in message.items():
        if key in known:
            continue
        if key in _MESSAGE_NEUTRAL and role == "assistant" and _MESSAGE_NEUTRAL[key](value):
            continue
        raise _bad(f"{where}.{key} is not supported by this server on a {role!r} message", "messages")
    if message.get("name") is not None and not isinstance(message["name"], str):
        raise _bad(f"{where}.name must be a string, got {_short(message['name'])}", "messages")
    calls = message.get("tool_calls")
    checked: dict = {"role": "system" if role == "developer" else role,
                     "content": _text(message.get("content"), where, may_be_null=role == "assistant" and bool(calls))}
    if message.get("name") is not None:
        checked["name"] = message["name"]
    if calls is not None:
        checked["tool_calls"] = _tool_calls(calls, where)
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise _bad(f"{where}.tool_call_id must be the id of the tool call it answers", "messages")
        checked["tool_call_id"] = message["tool_call_id"]
    return checked


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    return [_message(m, i) for i, m in enumerate(messages)]


def _prompt(body: dict, max_len: int | None) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt:
        if max_len is not None and len(prompt) >= max_len:  # before looking at every id of a huge list
            raise _bad(f"prompt has {len(prompt)} tokens; the context holds {max_len}, which must also leave room "
                       "for at least one new token", "prompt")
        if all(is_int(t) and t >= 0 for t in prompt):
            return [int(t) for t in prompt]
    raise _bad("prompt must be a non-empty string or a list of token ids (one prompt per request)", "prompt")


def _model(body: dict, required: bool = True) -> str | None:
    model = body.get("model")
    if (model is None and not required) or (isinstance(model, str) and model):
        return model
    raise _bad("model must be the name of a served model (GET /v1/models lists them)", "model")


def _template_flags(body: dict) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message): vLLM's chat options; not both."""
    cont = _flag(body, "continue_final_message")
    add = _flag(body, "add_generation_prompt", default=not cont)
    if add and cont:
        raise _bad("add_generation_prompt and continue_final_message cannot both be true", "continue_final_message")
    return add, cont


# ----------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class GenerationRequest:
    """One checked completions or chat request: what to generate from, how, and how to answer."""

    model: str
    prompt: str | list[int] | None  # completions
    messages: list[dict] | None  # chat
    params: SamplingParams
    stream: bool
    include_usage: bool  # streaming: a last chunk with the token counts
    continuous_usage: bool  # streaming: the token counts so far on every chunk (vLLM's continuous_usage_stats)
    add_special_tokens: bool | None  # None: the default (completions: add them; chat: the template decides)
    add_generation_prompt: bool = True  # chat
    continue_final_message: bool = False  # chat
    max_tokens_is_rest: bool = False  # chat without max_tokens: the rest of the context, once the prompt is known
    echo: bool = False  # completions: the prompt comes back before the answer (with logprobs, its tokens' too)
    logprobs: int | None = None  # alternatives per token to report; None: no logprobs
    prompt_only: bool = False  # max_tokens 0 with echo: the prompt (and its logprobs) and no answer
    prompt_logprobs: int | None = None  # vLLM's field, as asked: the answer then carries "prompt_logprobs"
    tools: ToolCalling | None = None  # chat that must call a function: the answer carries tool_calls
    constraint_field: str | None = None  # the field that asked for params.structured (a 400 about it names it)


def parse(body: object, chat: bool, default_max_tokens: int, vocab_size: int | None = None,
          max_model_len: int | None = None) -> GenerationRequest:
    """A completions (or, with `chat`, a chat completions) body -> GenerationRequest, or RequestError."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    check_fields(body, APPLIED_CHAT if chat else APPLIED_COMPLETIONS,
                 (_CHAT_NOT_YET | REPLACED | LATER_CHAT) if chat else (NOT_YET_APPLIED | REPLACED | LATER_COMPLETIONS),
                 METADATA)
    model = _model(body)
    stream = _flag(body, "stream")
    include_usage, continuous_usage = _stream_options(body, stream)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise _bad("top_p must be in (0, 1], got 0", "top_p")
    top_k = _integer(body, "top_k", None, -1)
    max_tokens = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    rest = chat and body.get(max_tokens) is None
    echo = not chat and _flag(body, "echo")
    # max_tokens 0 asks for nothing new: only with echo (the prompt's logprobs, as evaluation harnesses ask)
    count = None if rest else _integer(body, max_tokens, default_max_tokens, 0 if echo else 1)
    stop_token_ids = _token_ids(body, "stop_token_ids", vocab_size, MAX_STOP_TOKEN_IDS) \
        if body.get("stop_token_ids") is not None else []
    logprobs = _logprobs(body, chat)
    asked_prompt_logprobs = prompt_logprobs = _integer(body, "prompt_logprobs", None, 0, MAX_LOGPROBS)
    if echo and logprobs is not None:  # the echoed prompt's tokens come with their logprobs
        prompt_logprobs = max(logprobs, prompt_logprobs or 0)
    min_tokens = _integer(body, "min_tokens", 0, 0)
    if count is not None and min_tokens > max(count, 1):
        raise _bad(f"min_tokens={min_tokens} is more than max_tokens={count}", "min_tokens")
    if stream and asked_prompt_logprobs is not None:  # as vLLM: a prompt's logprobs come in a whole answer
        raise _bad("prompt_logprobs is not supported with stream: true (echo with logprobs streams the prompt's)",
                   "prompt_logprobs")
    try:
        constraint, calling = requested(body, chat)
    except ConstraintError as err:
        raise _bad(str(err), err.param) from None
    ignore_eos = _flag(body, "ignore_eos")
    if constraint is not None and (min_tokens or ignore_eos):  # once complete, its grammar allows only EOS
        name = "min_tokens" if min_tokens else "ignore_eos"
        raise _bad(f"{name} cannot be combined with a structured output ({constraint.field}): the constraint "
                   "decides where the output ends", name)
    # a chat without max_tokens gets the rest of the context once its prompt is known (app.py sets it)
    most = max(count, 1) if count is not None else (max_model_len or 1 << 30)
    try:
        params = SamplingParams(
            temperature=temperature, top_p=top_p, top_k=None if top_k in (None, -1, 0) else top_k,
            min_p=_number(body, "min_p", 0.0, 0.0, 1.0), max_new_tokens=most, min_tokens=min_tokens,
            seed=_integer(body, "seed", None, 0, 2**63 - 1), stop=_stop(body), stop_token_ids=tuple(stop_token_ids),
            ignore_eos=ignore_eos, n=_integer(body, "n", 1, 1, MAX_N),
            presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            repetition_penalty=_repetition_penalty(body),
            logit_bias=_logit_bias(body, vocab_size, max_list_items(max_model_len)),
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            include_stop_str_in_output=_flag(body, "include_stop_str_in_output"),
            skip_special_tokens=_flag(body, "skip_special_tokens", default=True),
            structured=constraint.output if constraint is not None else None)
    except ValueError as err:  # the engine's own checks, for anything the lines above let through
        raise _bad(str(err), None) from None
    special = _flag(body, "add_special_tokens") if body.get("add_special_tokens") is not None else None
    add_generation_prompt, continue_final_message = _template_flags(body) if chat else (True, False)
    return GenerationRequest(model, None if chat else _prompt(body, max_model_len), _messages(body) if chat else None,
                             params, stream, include_usage, continuous_usage, special, add_generation_prompt,
                             continue_final_message, rest, echo, logprobs, count == 0, asked_prompt_logprobs,
                             calling, constraint.field if constraint is not None else None)


def _repetition_penalty(body: dict) -> float:
    value = body.get("repetition_penalty")
    if value is None:
        return 1.0
    if not _real(value) or not 0 < value <= 2:
        raise _bad(f"repetition_penalty must be a number in (0, 2] (1 = none), got {_short(value)}",
                   "repetition_penalty")
    return float(value)


@dataclass(frozen=True)
class TokenizeRequest:
    """vLLM's /tokenize: a prompt (TokenizeCompletionRequest) or chat messages (TokenizeChatRequest)."""

    model: str | None
    prompt: str | None
    messages: list[dict] | None
    add_special_tokens: bool | None  # None: the default (a prompt: add them; messages: the template decides)
    return_token_strs: bool
    add_generation_prompt: bool = True
    continue_final_message: bool = False


def parse_tokenize(body: object) -> TokenizeRequest:
    """A /tokenize body -> TokenizeRequest, or RequestError."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    chat = "messages" in body
    check_fields(body, APPLIED_TOKENIZE_CHAT if chat else APPLIED_TOKENIZE, LATER_TOKENIZE_CHAT if chat else {}, {})
    special = _flag(body, "add_special_tokens") if body.get("add_special_tokens") is not None else None
    strs = _flag(body, "return_token_strs")
    if chat:
        return TokenizeRequest(_model(body, required=False), None, _messages(body), special, strs,
                               *_template_flags(body))
    if not isinstance(body.get("prompt"), str):
        raise _bad(f"prompt must be a string (or send messages), got {_short(body.get('prompt'))}", "prompt")
    return TokenizeRequest(_model(body, required=False), body["prompt"], None, special, strs)


def parse_detokenize(body: object, vocab_size: int, most: int) -> tuple[str | None, list[int]]:
    """A /detokenize body -> (model or None, token ids), or RequestError."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    check_fields(body, APPLIED_DETOKENIZE, {}, {})
    return _model(body, required=False), _token_ids(body, "tokens", vocab_size, most)
