"""Chat messages -> one prompt string (chapter 9).

A chat model is trained on conversations written in one exact format — its *chat template*, shipped
with its tokenizer. The server uses the checkpoint's own template when it has one. The course's
shipped models were trained on plain text (plays and arithmetic) and have none, so they get a plain
transcript in the plays' own style:

    SYSTEM:                  (only when a system message is given)
    You are terse.

    USER:
    What is 3+4?

    ASSISTANT:
"""

from __future__ import annotations


def render_chat(tokenizer, messages: list[dict]) -> str:
    """The prompt for `messages` ({role, content} dicts), ending where the assistant's answer begins."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    turns = [f"{m['role'].upper()}:\n{m['content']}\n\n" for m in messages]
    return "".join(turns) + "ASSISTANT:\n"
