"""Chat messages -> one prompt string (chapter 9).

A chat model is trained on conversations written in one exact format — its *chat template*, shipped
with its tokenizer. The server uses the checkpoint's own template when it has one, and gives it the
checked messages (protocol.py) as they are — tool calls, tool results, names — since templates know
what to do with them. Such a template writes its own special tokens (Llama 3's begins with
`{{ bos_token }}`), so its text is encoded without adding them again.

The course's shipped models were trained on plain text (plays and arithmetic) and have none, so
they get a plain transcript in the plays' own style. A turn's header is its role in capitals, with
the message's name — or, for a tool's result, the id of the call it answers — in parentheses:

    SYSTEM:                  (a system message; a developer message is a system message)
    You are terse.

    USER (alice):            (a user message with a name)
    What is the weather in Paris?

    ASSISTANT:               (an assistant turn that called tools: its text, if any, then each
    {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"}     call as a JSON line;
                              arguments that are JSON are written as JSON, others as their string)
    TOOL (call_1):           (a tool's result)
    18 degrees and sunny

    ASSISTANT:               (the generation prompt: where the answer begins)

The transcript writes no special tokens, so it is encoded as a completion's prompt is (with the
tokenizer's, when it adds any). With `continue_final_message` the last message is left open (no
blank line after it, no generation prompt) for the model to continue it.
"""

from __future__ import annotations

import json


class ChatTemplateError(ValueError):
    """The checkpoint's chat template refused (or failed on) the messages: a 400 naming its message."""


def has_chat_template(tokenizer) -> bool:
    """Whether the checkpoint brings a chat template (which then writes its own special tokens)."""
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                continue_final_message: bool = False, tools: list[dict] | None = None) -> str:
    """The prompt for `messages` (checked dicts: role, content, and maybe name, tool_calls,
    tool_call_id), ending where the assistant's answer begins (or, with `continue_final_message`,
    inside the last message). `tools`, the functions the answer must call, go to a template that
    knows them; the plain transcript leaves them out (the shipped models know no tools: the
    constraint alone shapes the call)."""
    if has_chat_template(tokenizer):
        options = {"continue_final_message": True} if continue_final_message else {}
        options |= {"tools": tools} if tools else {}
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                 **options)
        except Exception as err:  # jinja's errors, a template's raise_exception(...), a template's own bug
            raise ChatTemplateError(f"the model's chat template failed on these messages: "
                                    f"{str(err) or type(err).__name__}") from None
        if not isinstance(text, str):
            raise ChatTemplateError(f"the model's chat template gave a {type(text).__name__}, not a string")
        return text
    turns = [_turn(m) for m in messages]
    if continue_final_message:
        return "".join(turns)[: -len("\n\n")]
    return "".join(turns) + ("ASSISTANT:\n" if add_generation_prompt else "")


def _turn(message: dict) -> str:
    label = message.get("tool_call_id") if message["role"] == "tool" else message.get("name")
    header = message["role"].upper() + (f" ({label})" if label else "") + ":\n"
    lines = [message["content"]] if message.get("content") else []
    lines += [json.dumps({"name": call["function"]["name"], "arguments": _arguments(call["function"]["arguments"]),
                          "id": call["id"]}, ensure_ascii=False) for call in message.get("tool_calls") or ()]
    return header + "\n".join(lines) + "\n\n"


def _arguments(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
