"""A row's prompt: checking its shape, and turning it into the token ids the policy sees.

A prompt is a chat list of `{role, content}` messages (verl's schema) or a plain string:

| prompt      | data.apply_chat_template=true, tokenizer has a template | otherwise                       |
|-------------|----------------------------------------------------------|---------------------------------|
| chat list   | rendered by the template, generation prompt appended     | error (needs a template)        |
| string      | wrapped as one user message, then rendered (as verl SFT) | tokenised as-is (tokenizer's    |
|             |                                                          | own special tokens, e.g. BOS)   |

Rendered text is tokenised without adding special tokens: the template already wrote them.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import PreTrainedTokenizerBase

from megarl.config.roles import ModelSpec
from megarl.config.schema import ModelConfig
from megarl.errors import EXIT_USAGE, MegarlError

Messages = list[dict[str, Any]]


class TokenizerError(MegarlError, ValueError):
    """The policy's tokenizer cannot be loaded; the message names the key, the directory and the fix."""

    exit_code = EXIT_USAGE


def load_tokenizer(model: ModelConfig | ModelSpec) -> PreTrainedTokenizerBase:
    """The policy's tokenizer, from model.tokenizer_path or else model.path. A directory without one that
    transformers can load raises TokenizerError (not transformers' ValueError/OSError and traceback)."""
    from transformers import AutoTokenizer

    key, path = (
        ("model.tokenizer_path", model.tokenizer_path) if model.tokenizer_path else ("model.path", model.path)
    )
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        held = sorted(os.listdir(path)) if path and os.path.isdir(path) else []
        raise TokenizerError(
            f"{key}={path} holds no tokenizer transformers can load ({type(e).__name__}); it has: "
            f"{', '.join(held) or 'nothing'}. Copy the tokenizer files (tokenizer.json, tokenizer_config.json) "
            "from the original checkpoint into it, or set model.tokenizer_path to a directory that has them"
        ) from None


def prompt_problem(prompt: Any) -> str | None:
    """Why `prompt` is not a usable prompt (one short phrase), or None when it is."""
    if isinstance(prompt, str):
        return "empty prompt string" if not prompt.strip() else None
    if not isinstance(prompt, list | tuple) and not hasattr(prompt, "tolist"):
        return f"prompt is {type(prompt).__name__}, expected a chat list of {{role, content}} or a string"
    messages = list(prompt)
    if not messages:
        return "empty chat list"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"message {i} is {type(message).__name__}, expected a {{role, content}} dict"
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                return f"message {i} has no string {key!r}"
    if not any(m["content"].strip() for m in messages):
        return "every message of the chat list is empty"
    return None


def as_messages(prompt: str | Messages) -> Messages:
    """The prompt as chat messages: a string becomes one user turn; None-valued keys are dropped (parquet
    gives every message every key that any message in the column has)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{k: v for k, v in message.items() if v is not None} for message in prompt]


def uses_template(
    prompt: str | Messages, tokenizer: PreTrainedTokenizerBase, apply_chat_template: bool
) -> bool:
    """Whether the prompt is rendered by the chat template (see the module table)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    return not isinstance(prompt, str) or (apply_chat_template and has_template)


def prompt_text(
    prompt: str | Messages, tokenizer: PreTrainedTokenizerBase, apply_chat_template: bool
) -> tuple[str, bool]:
    """(text to tokenise, whether the tokenizer should add its special tokens) of a checked prompt.
    Raises ValueError for a chat list that cannot be rendered (no template, or apply_chat_template=false)."""
    if not uses_template(prompt, tokenizer, apply_chat_template):
        return str(prompt), True
    if not apply_chat_template or not getattr(tokenizer, "chat_template", None):
        why = (
            "data.apply_chat_template=false"
            if not apply_chat_template
            else "the tokenizer has no chat template"
        )
        raise ValueError(
            f"the prompt is a chat list but {why}; use a tokenizer with a chat template and "
            "data.apply_chat_template=true, or give plain-string prompts"
        )
    text = tokenizer.apply_chat_template(as_messages(prompt), add_generation_prompt=True, tokenize=False)
    return text, False
