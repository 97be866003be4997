"""Preference data: chosen/rejected pairs (DPO, IPO, ORPO, SimPO) and labelled completions (KTO).

Rows (parquet or jsonl) in the forms Hugging Face preference datasets use (TRL's standard and
conversational formats, explicit or implicit prompt). Column names are data.prompt_key, data.chosen_key,
data.rejected_key, data.completion_key and data.label_key:

| rows  | prompt                     | chosen, rejected / completion                                  |
|-------|----------------------------|----------------------------------------------------------------|
| pairs | string or chat list        | strings, or chat lists of one assistant turn                   |
| pairs | none (implicit prompt)     | full conversations; the prompt is the messages before their    |
|       |                            | last (assistant) turn, which chosen and rejected must share    |
| KTO   | string or chat list        | completion as for pairs; label a bool (or 0/1)                 |
| KTO   | none (implicit prompt)     | completion a full conversation ending in the assistant turn    |

Prompts are rendered exactly as SFT and RL prompts are (`megarl.data.sft.encode_prompt`); responses are
tokenised without special tokens, EOS appended. Rows whose prompt is longer than data.max_prompt_length,
or any of whose responses is longer than data.max_response_length, are dropped and counted. Malformed
rows (missing columns, a chat-list response that is not one assistant turn, implicit prompts that differ,
a label that is not a bool or 0/1, chosen and rejected with the same tokens) are reported with file and
row and skipped.

Batches have `sft_batch`'s layout (left-padded prompts ‖ right-padded responses, response_mask):
`pair_batch` interleaves each pair's chosen and rejected rows, `kto_batch` adds the `desirable` label and
`kto_kl_batch` pairs each prompt with another example's completion (KTO's KL reference point, partners
from `kl_partners`). `batches` is the epoch order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from megarl.config.schema import DataConfig
from megarl.data.chat import Messages, as_messages, prompt_problem
from megarl.data.files import DataError, read_rows
from megarl.data.sft import SFTExample, batches, encode_prompt, encode_response, report_skipped, sft_batch
from megarl.protocol import Batch

__all__ = [
    "KTOExample",
    "PreferencePair",
    "batches",
    "kto_batch",
    "kl_partners",
    "kto_kl_batch",
    "load_kto_examples",
    "load_preference_pairs",
    "pair_batch",
]

T = TypeVar("T")


@dataclass(frozen=True)
class PreferencePair:
    where: str
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]


@dataclass(frozen=True)
class KTOExample:
    where: str
    prompt_ids: list[int]
    completion_ids: list[int]
    desirable: bool


def _is_assistant_turn(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and isinstance(message.get("content"), str)
        and bool(message["content"])
    )


def _roles(messages: list) -> str:
    return ", ".join(str(m.get("role")) if isinstance(m, dict) else type(m).__name__ for m in messages)


def _response(value: Any, key: str) -> str:
    """The text of a response column: a string, or the content of a chat list's single assistant turn."""
    if isinstance(value, str):
        if not value:
            raise ValueError(f"`{key}` is an empty string")
        return value
    if isinstance(value, list):
        if len(value) == 1 and _is_assistant_turn(value[0]):
            return value[0]["content"]
        raise ValueError(f"`{key}` must be one assistant turn after the prompt (got [{_roles(value)}])")
    raise ValueError(
        f"`{key}` is {type(value).__name__}, expected a string or a chat list of one assistant turn"
    )


def _conversation(value: Any, key: str, prompt_key: str) -> tuple[Messages, str]:
    """(the messages before the last turn, the last turn's text) of a full conversation."""
    if not isinstance(value, list) or len(value) < 2 or not _is_assistant_turn(value[-1]):
        raise ValueError(
            f"without a `{prompt_key}` column, `{key}` must be a full conversation ending in an "
            "assistant turn"
        )
    return as_messages(value[:-1]), value[-1]["content"]


def _prompt_ids(prompt: Any, tokenizer, data: DataConfig) -> list[int]:
    problem = prompt_problem(prompt)
    if problem:
        raise ValueError(f"`{data.prompt_key}`: {problem}")
    return encode_prompt(prompt if isinstance(prompt, str) else list(prompt), tokenizer, data)


def _needs(row: dict, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if row.get(k) is None]
    if missing:
        raise ValueError(
            f"needs {' and '.join(f'`{k}`' for k in keys)} columns (missing {', '.join(missing)})"
        )


def _pair(where: str, row: dict, tokenizer, data: DataConfig) -> PreferencePair | None:
    """The pair of one row; None when it is too long. Raises ValueError when the row is malformed."""
    chosen_key, rejected_key = data.chosen_key, data.rejected_key
    _needs(row, (chosen_key, rejected_key))
    if row.get(data.prompt_key) is not None:
        prompt = row[data.prompt_key]
        chosen, rejected = _response(row[chosen_key], chosen_key), _response(row[rejected_key], rejected_key)
    else:
        prompt, chosen = _conversation(row[chosen_key], chosen_key, data.prompt_key)
        other, rejected = _conversation(row[rejected_key], rejected_key, data.prompt_key)
        if other != prompt:
            raise ValueError(
                f"without a `{data.prompt_key}` column, `{chosen_key}` and `{rejected_key}` must share the "
                "messages before their last assistant turn (the prompt), but they differ"
            )
    pair = PreferencePair(
        where,
        _prompt_ids(prompt, tokenizer, data),
        encode_response(chosen, tokenizer, data),
        encode_response(rejected, tokenizer, data),
    )
    if pair.chosen_ids == pair.rejected_ids:
        raise ValueError(f"`{chosen_key}` and `{rejected_key}` are identical")
    too_long = max(len(pair.chosen_ids), len(pair.rejected_ids)) > data.max_response_length
    return None if too_long or len(pair.prompt_ids) > data.max_prompt_length else pair


def _labelled(where: str, row: dict, tokenizer, data: DataConfig) -> KTOExample | None:
    """The KTO example of one row; None when it is too long. Raises ValueError when the row is malformed."""
    completion_key, label_key = data.completion_key, data.label_key
    _needs(row, (completion_key, label_key))
    label = row[label_key]
    if not isinstance(label, bool) and not (type(label) is int and label in (0, 1)):
        raise ValueError(f"`{label_key}` must be a bool (or 0/1), got {label!r}")
    if row.get(data.prompt_key) is not None:
        prompt, completion = row[data.prompt_key], _response(row[completion_key], completion_key)
    else:
        prompt, completion = _conversation(row[completion_key], completion_key, data.prompt_key)
    example = KTOExample(
        where, _prompt_ids(prompt, tokenizer, data), encode_response(completion, tokenizer, data), bool(label)
    )
    too_long = len(example.prompt_ids) > data.max_prompt_length
    return None if too_long or len(example.completion_ids) > data.max_response_length else example


def _load(
    files: list[str],
    config_key: str,
    kind: str,
    data: DataConfig,
    parse: Callable[[str, dict], T | None],
    what: str,
    needs: str,
) -> list[T]:
    """The usable items of `files`; the skipped rows are reported, and DataError (naming `what` was
    looked for and what rows `needs`) is raised when none is left."""
    items: list[T] = []
    problems: list[str] = []
    too_long: list[str] = []
    for path in files:
        for raw in read_rows(path, config_key):
            try:
                if isinstance(raw.value, str):
                    raise ValueError(raw.value)
                item = parse(raw.where, raw.value)
            except ValueError as e:
                problems.append(f"{raw.where}: {e}")
                continue
            if item is None:
                too_long.append(raw.where)
            else:
                items.append(item)
    report_skipped(kind, problems, too_long, data)
    if not items:
        raise DataError(
            f"{config_key}: no usable {what} in {', '.join(files)} ({len(problems)} malformed, {len(too_long)} too "
            f"long); rows need {needs}, within the length limits"
        )
    return items


def load_preference_pairs(
    files: list[str], tokenizer, data: DataConfig, config_key: str
) -> list[PreferencePair]:
    """Every usable (prompt, chosen, rejected) row of `files` (see the module table); skipped rows are
    reported once, and DataError is raised when none is left."""
    needs = (
        f"`{data.prompt_key}`, `{data.chosen_key}` and `{data.rejected_key}` columns (strings or chat lists), "
        f"or `{data.chosen_key}` and `{data.rejected_key}` as full conversations sharing the prompt"
    )
    return _load(
        files,
        config_key,
        "preference",
        data,
        lambda where, row: _pair(where, row, tokenizer, data),
        "preference pairs",
        needs,
    )


def load_kto_examples(files: list[str], tokenizer, data: DataConfig, config_key: str) -> list[KTOExample]:
    """Every usable (prompt, completion, label) row of `files` (see the module table); skipped rows are
    reported once, and DataError is raised when none is left."""
    needs = (
        f"`{data.prompt_key}`, `{data.completion_key}` (a string or chat list) and `{data.label_key}` (bool) "
        f"columns, or `{data.completion_key}` as a full conversation"
    )
    return _load(
        files,
        config_key,
        "kto",
        data,
        lambda where, row: _labelled(where, row, tokenizer, data),
        "KTO rows",
        needs,
    )


def pair_batch(pairs: list[PreferencePair], pad_token_id: int) -> Batch:
    """2·P rows, chosen and rejected interleaved: row 2i is pair i's chosen response, row 2i+1 its
    rejected one."""
    rows = [SFTExample(p.where, p.prompt_ids, ids) for p in pairs for ids in (p.chosen_ids, p.rejected_ids)]
    return sft_batch(rows, pad_token_id)


def kto_batch(examples: list[KTOExample], pad_token_id: int) -> Batch:
    """N rows, plus `desirable` (bool [N]): the label of each completion."""
    batch = sft_batch([SFTExample(e.where, e.prompt_ids, e.completion_ids) for e in examples], pad_token_id)
    batch["desirable"] = torch.tensor([e.desirable for e in examples], dtype=torch.bool)
    return batch


def kl_partners(examples: list[KTOExample], seed: int = 0) -> list[int]:
    """For each example, whose completion its prompt is paired with in KTO's KL estimate: the next one
    along a fixed-seed random cycle through the data set (never itself), stepping on past completions of
    the same prompt where one of the next few differs (data made from pairs often has both answers of a
    prompt on adjacent rows, and a matched pair would bias the reference point)."""
    n = len(examples)
    if n < 2:
        raise ValueError(
            f"the KTO KL batch mismatches prompts and completions, which needs ≥ 2 examples, got {n}"
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    position = {i: k for k, i in enumerate(order)}
    partners = []
    for i in range(n):
        candidates = [order[(position[i] + step) % n] for step in range(1, min(n, 9))]
        differ = [j for j in candidates if examples[j].prompt_ids != examples[i].prompt_ids]
        partners.append(differ[0] if differ else candidates[0])
    return partners


def kto_kl_batch(
    examples: list[KTOExample],
    pad_token_id: int,
    indices: list[int] | None = None,
    partners: list[int] | None = None,
) -> Batch:
    """KTO's KL reference point: for each i of `indices` (default: all), prompt i with the completion of
    its partner (`kl_partners(examples)` unless given): fixed by the data set, so a precomputed reference
    log-prob of the pair stays valid in any batch."""
    partners = kl_partners(examples) if partners is None else partners
    rows = [
        SFTExample(examples[i].where, examples[i].prompt_ids, examples[partners[i]].completion_ids)
        for i in (range(len(examples)) if indices is None else indices)
    ]
    return sft_batch(rows, pad_token_id)
