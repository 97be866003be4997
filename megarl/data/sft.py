"""Supervised fine-tuning data: (prompt, response) pairs as rollout-schema batches with a response mask.

Rows (parquet or jsonl) hold either a prompt and a response (data.prompt_key / data.response_key; the
prompt a string or a chat list) or `messages`, a chat list whose last turn is the assistant's response.
verl's SFT keys read nested columns: data.prompt_key=extra_info with data.prompt_dict_keys=[question]
(or data.prompt_key=extra_info.question) reads row["extra_info"]["question"], as verl's GSM8K SFT
recipe does. With data.multiturn.enable, the data.multiturn.messages_key column is a conversation and
every assistant turn in it is one example, the turns before it its prompt.
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
from typing import Any, TypeVar

import torch

from megarl.config.schema import DataConfig
from megarl.data.chat import Messages, as_messages, prompt_problem, prompt_text
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


class _Unusable(DataError):
    """Why one row gives no SFT example (its message names the column and what the row holds); caught
    per row and reported with the file and row."""


def _columns(row: dict) -> str:
    return ", ".join(map(str, row)) or "none"


def _lookup(row: dict, key: str, dict_keys: Sequence[str], setting: str) -> Any:
    """row[key][k1][k2]… for dict_keys [k1, k2, …] (verl's data.prompt_dict_keys); a dotted key
    (extra_info.answer) is read the same way unless a column has that very name."""
    if key in row:
        path, value = [key], row[key]
    else:
        head, *rest = key.split(".")
        if head not in row:
            raise _Unusable(f"no column {head!r} ({setting}={key}); the columns present: {_columns(row)}")
        path, value, dict_keys = [head], row[head], [*rest, *dict_keys]
    for k in dict_keys:
        if not isinstance(value, dict):
            raise _Unusable(
                f"column {'.'.join(path)} is a {type(value).__name__}, not a struct with key {k!r} "
                f"({setting}={key}); the columns present: {_columns(row)}"
            )
        if k not in value:
            raise _Unusable(
                f"column {'.'.join(path)} has no key {k!r} ({setting}={key}); its keys: {_columns(value)}"
            )
        path, value = [*path, k], value[k]
    return value


def _pair(prompt: Any, response: Any) -> tuple[object, str]:
    if not isinstance(response, str) or not response:
        raise _Unusable(f"the response is not a non-empty string (got {type(response).__name__})")
    if not (isinstance(prompt, str) and prompt) and not isinstance(prompt, list):
        raise _Unusable(f"the prompt is not a string or chat list (got {type(prompt).__name__})")
    return prompt, response


def _conversation(row: dict, data: DataConfig) -> list[tuple[object, str]]:
    """data.multiturn.enable: one (turns before it, its content) pair per assistant turn after the first
    turn of the messages_key conversation."""
    key = data.multiturn.messages_key
    if key not in row:
        raise _Unusable(
            f"no column {key!r} (data.multiturn.messages_key={key}); the columns present: {_columns(row)}"
        )
    messages = row[key]
    if not isinstance(messages, list) or not messages:
        raise _Unusable(f"column {key!r} is not a non-empty chat list (got {type(messages).__name__})")
    if problem := prompt_problem(messages):
        raise _Unusable(f"column {key!r}: {problem}")
    pairs = [
        _pair(messages[:i], m["content"]) for i, m in enumerate(messages) if i and m["role"] == "assistant"
    ]
    if not pairs:
        raise _Unusable(f"column {key!r} has no assistant turn after another turn to train on")
    return pairs


def _split(row: dict, data: DataConfig) -> list[tuple[object, str]]:
    """The (prompt, response) pairs of a row; raises _Unusable with the reason it has none."""
    if data.multiturn.enable:
        return _conversation(row, data)
    try:
        prompt = _lookup(row, data.prompt_key, data.prompt_dict_keys, "data.prompt_key")
        response = _lookup(row, data.response_key, data.response_dict_keys, "data.response_key")
    except _Unusable:
        if not isinstance(row.get("messages"), list) or not row["messages"]:
            raise
        *context, last = row["messages"]
        if not isinstance(last, dict) or last.get("role") != "assistant" or not context:
            raise _Unusable(
                "`messages` must end with an assistant turn after at least one other turn"
            ) from None
        prompt, response = context, last.get("content")
    return [_pair(prompt, response)]


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
            if not isinstance(raw.value, dict):
                problems.append(f"{raw.where}: {raw.value}")
                continue
            try:
                pairs = _split(raw.value, data)
                encoded = [
                    (encode_prompt(p, tokenizer, data), encode_response(r, tokenizer, data)) for p, r in pairs
                ]
            except (_Unusable, ValueError) as e:
                problems.append(f"{raw.where}: {e}")
                continue
            for prompt_ids, response_ids in encoded:
                if len(prompt_ids) > data.max_prompt_length or len(response_ids) > data.max_response_length:
                    too_long.append(raw.where)
                else:
                    examples.append(SFTExample(raw.where, prompt_ids, response_ids))
    report_skipped("sft", problems, too_long, data)
    if not examples:
        first = f"; the first: {problems[0]}" if problems else ""
        raise DataError(
            f"{config_key}: no usable SFT rows in {', '.join(files)} ({len(problems)} malformed, {len(too_long)} too "
            f"long){first}. Rows need {_wanted(data)}, within the length limits"
        )
    return examples


def _wanted(data: DataConfig) -> str:
    if data.multiturn.enable:
        return f"a {data.multiturn.messages_key!r} chat list (data.multiturn.messages_key)"
    prompt = ".".join([data.prompt_key, *data.prompt_dict_keys])
    response = ".".join([data.response_key, *data.response_dict_keys])
    return (
        f"the prompt at {prompt} and the response at {response} (data.prompt_key / data.prompt_dict_keys, "
        "data.response_key / data.response_dict_keys), or a `messages` chat list"
    )


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
