"""Supervised fine-tuning data: (prompt, response) pairs as rollout-schema batches with a response mask.

Rows (parquet or jsonl) hold either `prompt` + `response` (data.prompt_key / data.response_key; the
prompt a string or a chat list) or `messages`, a chat list whose last turn is the assistant's response.
Prompts are rendered exactly as RL prompts are (megarl.data.chat: the chat template with the
generation prompt, per data.apply_chat_template), so the SFT model answers in the format RL samples; the
response ends with EOS. The loss covers response tokens only (`response_mask`).

The tokenisation (`encode_prompt`, `encode_response`), the report of skipped rows, the batch layout
(`sft_batch`) and the epoch order (`batches`) are shared with the preference data (megarl.data.preference).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from megarl.config.schema import DataConfig
from megarl.data.chat import Messages, as_messages, prompt_text
from megarl.data.files import DataError, per_file, read_rows
from megarl.data.lengths import capped_token_ids
from megarl.protocol import Batch

T = TypeVar("T")
log = logging.getLogger("megarl.data")


@dataclass(frozen=True)
class SFTExample:
    where: str
    prompt_ids: list[int]
    response_ids: list[int]


def _split(row: dict, data: DataConfig) -> tuple[object, str] | str:
    """(prompt, response) of a row, or the reason it is unusable."""
    if data.prompt_key in row and data.response_key in row:
        prompt, response = row[data.prompt_key], row[data.response_key]
    elif isinstance(row.get("messages"), list) and row["messages"]:
        *context, last = row["messages"]
        if not isinstance(last, dict) or last.get("role") != "assistant" or not context:
            return "`messages` must end with an assistant turn after at least one other turn"
        prompt, response = context, last.get("content")
    else:
        return f"needs `{data.prompt_key}` and `{data.response_key}` columns, or a `messages` chat list"
    if not isinstance(response, str) or not response:
        return f"the response is not a non-empty string (got {type(response).__name__})"
    if not (isinstance(prompt, str) and prompt) and not isinstance(prompt, list):
        return f"the prompt is not a string or chat list (got {type(prompt).__name__})"
    return prompt, response


def encode_prompt(prompt: str | Messages, tokenizer, data: DataConfig) -> list[int]:
    """Token ids of a checked prompt, rendered exactly as RL prompts are (megarl.data.datasets), so
    training on them teaches the format RL samples in. Raises ValueError when it cannot be rendered."""
    text, special = prompt_text(
        as_messages(prompt) if isinstance(prompt, list) else prompt, tokenizer, data.apply_chat_template
    )
    return capped_token_ids(text, tokenizer, data.max_prompt_length, special)


def encode_response(response: str, tokenizer, data: DataConfig) -> list[int]:
    """Token ids of a response, without special tokens, EOS appended (the policy stops there). A
    response surely longer than data.max_response_length is cut short in characters before it is
    tokenised (`megarl.data.lengths`): its ids are still too many."""
    ids = capped_token_ids(response, tokenizer, data.max_response_length, add_special_tokens=False)
    return ids + [tokenizer.eos_token_id]


def report_skipped(kind: str, problems: list[str], too_long: list[str], data: DataConfig) -> None:
    """One warning per category of skipped rows: the malformed ones (the first 5, with file and row) and
    the over-long ones (counted per file)."""
    if problems:
        shown = "\n  ".join(problems[:5])
        log.warning("megarl %s: skipped %d malformed row(s):\n  %s", kind, len(problems), shown)
    if too_long:
        log.warning(
            "megarl %s: skipped %d row(s) longer than data.max_prompt_length=%d / data.max_response_length=%d "
            "in %s",
            kind,
            len(too_long),
            data.max_prompt_length,
            data.max_response_length,
            per_file(too_long),
        )


def load_sft_examples(files: list[str], tokenizer, data: DataConfig, config_key: str) -> list[SFTExample]:
    """Every usable row of `files`; rows that are malformed or longer than the length limits are
    reported once (file and row), and DataError is raised when none is left."""
    examples: list[SFTExample] = []
    problems: list[str] = []
    too_long: list[str] = []
    for path in files:
        for raw in read_rows(path, config_key):
            split = _split(raw.value, data) if isinstance(raw.value, dict) else raw.value
            if isinstance(split, str):
                problems.append(f"{raw.where}: {split}")
                continue
            prompt, response = split
            try:
                prompt_ids = encode_prompt(prompt, tokenizer, data)
            except ValueError as e:
                problems.append(f"{raw.where}: {e}")
                continue
            response_ids = encode_response(response, tokenizer, data)
            if len(prompt_ids) > data.max_prompt_length or len(response_ids) > data.max_response_length:
                too_long.append(raw.where)
                continue
            examples.append(SFTExample(raw.where, prompt_ids, response_ids))
    report_skipped("sft", problems, too_long, data)
    if not examples:
        raise DataError(
            f"{config_key}: no usable SFT rows in {', '.join(files)} ({len(problems)} malformed, {len(too_long)} too "
            "long); rows need prompt/response columns or a messages list, within the length limits"
        )
    return examples


def sft_batch(examples: list[SFTExample], pad_token_id: int) -> Batch:
    """Left-padded prompts ‖ right-padded responses, as in a rollout batch."""
    p = max(len(e.prompt_ids) for e in examples)
    r = max(len(e.response_ids) for e in examples)
    n = len(examples)
    prompts = torch.full((n, p), pad_token_id, dtype=torch.long)
    responses = torch.full((n, r), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros(n, p, dtype=torch.long)
    response_mask = torch.zeros(n, r, dtype=torch.long)
    for i, e in enumerate(examples):
        prompts[i, p - len(e.prompt_ids) :] = torch.tensor(e.prompt_ids)
        prompt_mask[i, p - len(e.prompt_ids) :] = 1
        responses[i, : len(e.response_ids)] = torch.tensor(e.response_ids)
        response_mask[i, : len(e.response_ids)] = 1
    return Batch(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": torch.cat([prompt_mask, response_mask], 1),
            "response_mask": response_mask.float(),
        }
    )


def batches(items: Sequence[T], batch_size: int, seed: int, epoch: int) -> Iterator[list[T]]:
    """One epoch of full batches of `items` in a (seed, epoch)-determined order (the last partial batch
    is dropped)."""
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed * 100003 + epoch))
    for start in range(0, len(items) - batch_size + 1, batch_size):
        yield [items[i] for i in order[start : start + batch_size].tolist()]
