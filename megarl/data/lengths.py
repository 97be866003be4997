"""Texts too long to be worth tokenising: a prompt of megabytes costs minutes and gigabytes to tokenise,
only to be dropped for its length. No token of a vocabulary spells more characters than its longest
entry does (bytes, for byte-level BPE, which are at least as many as the characters they spell), so a
text of more than `max_tokens` × that many characters has more than `max_tokens` tokens; the bound is
doubled for normalisers that shorten a text (Unicode composition) before it is split."""

from __future__ import annotations

import functools

from transformers import PreTrainedTokenizerBase

__all__ = ["capped_token_ids", "char_limit"]

_SLACK = 2


@functools.lru_cache(maxsize=8)
def _longest_token(tokenizer: PreTrainedTokenizerBase) -> int:
    return max(map(len, tokenizer.get_vocab()), default=1)


def char_limit(tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> int:
    """Characters beyond which a text surely has more than `max_tokens` tokens of `tokenizer`."""
    return max_tokens * _longest_token(tokenizer) * _SLACK


def capped_token_ids(
    text: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int, add_special_tokens: bool
) -> list[int]:
    """`text`'s token ids; for a text surely longer than `max_tokens`, those of its first
    `char_limit + 1` characters only: still more than `max_tokens`, at a bounded cost."""
    limit = char_limit(tokenizer, max_tokens)
    text = text[: limit + 1] if len(text) > limit else text
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
