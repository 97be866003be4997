"""Prompt datasets in verl's row schema, read unchanged from parquet / jsonl files.

A row holds `data_source` (which reward scores it), `prompt` (a chat list of {role, content}, or a plain
string; the column is `data.prompt_key`), `ability`, `reward_model` ({style, ground_truth}) and
`extra_info` (any dict, handed to the reward function). `PromptDataset` tokenises every prompt once, at
load time (`megarl.data.chat` says how templates apply), and keeps the usable rows:

- a malformed row (no prompt, wrong type, empty; no ground truth when `require_ground_truth`, as the
  rule rewards need) is skipped and reported with its file and row;
- a prompt longer than `data.max_prompt_length` tokens is dropped and counted per file (one warning
  line); one so long in characters that it surely is (`megarl.data.lengths`) is dropped untokenised;
- only when no row at all is usable does loading stop, with a `DataError` saying why and how to fix it.

`dataset.batch(indices)` is what the rollout consumes: `prompts` [B, P] long, left-padded with the pad id
to the longest prompt of the batch, `attention_mask` [B, P] long (1 on real tokens), `index` [B] long (the
row's position in the dataset), plus non-tensor columns carried through generation to the reward:
`data_source`, `ground_truth` (from `reward_model.ground_truth`, else a top-level `ground_truth`),
`reward_model`, `extra_info` ({} when absent), `ability`, `raw_prompt` (the chat messages; a string prompt
as one user turn) and `prompt_text` (the text that was tokenised).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from megarl.config.schema import DataConfig
from megarl.data.chat import Messages, as_messages, prompt_problem, prompt_text
from megarl.data.files import DataError, RawRow, per_file, read_rows
from megarl.data.lengths import char_limit
from megarl.protocol import Batch

__all__ = ["DataError", "DataReport", "PromptDataset", "PromptRow"]

log = logging.getLogger("megarl.data")

_SHOWN_ROWS = 5  # rows named per problem in messages
_NO_TRUTH = "no ground truth (reward_model.ground_truth), which the rule rewards compare with"


@dataclass(frozen=True)
class PromptRow:
    """One usable prompt, tokenised."""

    where: str  # file and row it came from, e.g. "train.parquet row 7"
    prompt_ids: list[int]
    prompt_text: str
    raw_prompt: Messages
    data_source: str
    ground_truth: Any
    reward_model: dict[str, Any]
    extra_info: dict[str, Any]
    ability: str | None


@dataclass
class DataReport:
    """What loading kept and dropped: the numbers behind the warnings."""

    files: list[str]
    rows_read: int = 0
    kept: int = 0
    malformed: dict[str, list[str]] = field(default_factory=dict)  # problem -> rows ("file row N")
    # (row, token count): None for a prompt longer than char_limit characters, dropped untokenised
    too_long: list[tuple[str, int | None]] = field(default_factory=list)
    char_limit: int = 0  # characters beyond which a prompt is surely too long (megarl.data.lengths)

    @property
    def n_malformed(self) -> int:
        return sum(len(rows) for rows in self.malformed.values())

    def needed_prompt_length(self, max_prompt_length: int) -> int:
        """The data.max_prompt_length that would keep every too-long prompt, or a lower bound of it."""
        return max((n or max_prompt_length + 1 for _, n in self.too_long), default=max_prompt_length)


class PromptDataset:
    """The usable, tokenised prompts of some verl-schema files (see the module doc)."""

    def __init__(
        self,
        files: Sequence[str],
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_length: int,
        *,
        prompt_key: str = "prompt",
        apply_chat_template: bool = True,
        filter_overlong_prompts: bool = True,
        config_key: str = "data.train_files",
        require_ground_truth: bool = False,
    ) -> None:
        if not files:
            raise DataError(f"{config_key} is empty; set {config_key}=[path/to/train.parquet]")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise DataError("the tokenizer has neither a pad nor an EOS token to left-pad prompts with")
        self.pad_token_id: int = pad
        self.config_key = config_key
        self.max_prompt_length = max_prompt_length
        self.report = DataReport(files=list(files))
        self.require_ground_truth = require_ground_truth
        raw = [row for path in files for row in read_rows(path, config_key)]
        self.report.rows_read = len(raw)
        candidates = [c for c in (self._parse(r, prompt_key) for r in raw) if c is not None]
        self.rows: list[PromptRow] = self._tokenise(candidates, tokenizer, apply_chat_template)
        self.report.kept = len(self.rows)
        self._report(prompt_key, filter_overlong_prompts)

    @classmethod
    def from_config(
        cls,
        data: DataConfig,
        tokenizer: PreTrainedTokenizerBase,
        split: Literal["train", "val"] = "train",
        require_ground_truth: bool = False,
    ) -> PromptDataset:
        """The `data.train_files` or `data.val_files` dataset of a config (rows without a ground truth
        skipped as malformed when `require_ground_truth`: the rule rewards need one)."""
        return cls(
            data.train_files if split == "train" else data.val_files,
            tokenizer,
            data.max_prompt_length,
            prompt_key=data.prompt_key,
            apply_chat_template=data.apply_chat_template,
            filter_overlong_prompts=data.filter_overlong_prompts,
            config_key=f"data.{split}_files",
            require_ground_truth=require_ground_truth,
        )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> PromptRow:
        return self.rows[i]

    @property
    def data_sources(self) -> list[str]:
        """Every distinct `data_source` of the kept rows, sorted (check them against the rewards early)."""
        return sorted({row.data_source for row in self.rows})

    def batch(self, indices: Sequence[int]) -> Batch:
        """The rows at `indices` as a left-padded prompt Batch (schema in the module doc)."""
        rows = [self.rows[int(i)] for i in indices]
        width = max((len(r.prompt_ids) for r in rows), default=0)
        prompts = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r.prompt_ids)
            prompts[i, width - n :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, width - n :] = 1
        columns = {
            "data_source": [r.data_source for r in rows],
            "ground_truth": [r.ground_truth for r in rows],
            "reward_model": [r.reward_model for r in rows],
            "extra_info": [r.extra_info for r in rows],
            "ability": [r.ability for r in rows],
            "raw_prompt": [r.raw_prompt for r in rows],
            "prompt_text": [r.prompt_text for r in rows],
        }
        index = torch.tensor([int(i) for i in indices], dtype=torch.long)
        tensors = {"prompts": prompts, "attention_mask": mask, "index": index}
        return Batch(tensors, {k: _objects(v) for k, v in columns.items()})

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """Every row in file order, `batch_size` at a time, the last batch possibly shorter (validation)."""
        for start in range(0, len(self), batch_size):
            yield self.batch(range(start, min(start + batch_size, len(self))))

    def _parse(self, raw: RawRow, prompt_key: str) -> tuple[RawRow, Any] | None:
        """(row, prompt) of a row whose fields have the right shapes; records the problem otherwise."""
        if isinstance(raw.value, str):
            return self._malformed(raw.value, raw)
        row = raw.value
        if row.get(prompt_key) is None:
            return self._malformed(f"no {prompt_key!r} field", raw)
        problem = prompt_problem(row[prompt_key])
        for key in ("reward_model", "extra_info"):
            if problem is None and row.get(key) is not None and not isinstance(row[key], dict):
                problem = f"{key} is {type(row[key]).__name__}, expected a dict"
        if problem is None and self.require_ground_truth and _ground_truth(row) is None:
            problem = _NO_TRUTH
        if problem is not None:
            return self._malformed(problem, raw)
        return raw, row[prompt_key]

    def _malformed(self, problem: str, raw: RawRow) -> None:
        self.report.malformed.setdefault(problem, []).append(raw.where)
        return None

    def _tokenise(
        self, candidates: list[tuple[RawRow, Any]], tokenizer: PreTrainedTokenizerBase, apply: bool
    ) -> list[PromptRow]:
        texts = []
        for raw, prompt in candidates:
            try:
                texts.append(prompt_text(_plain(prompt), tokenizer, apply))
            except ValueError as e:
                raise DataError(f"{self.config_key}: {raw.where}: {e}") from None
        self.report.char_limit = char_limit(tokenizer, self.max_prompt_length)
        ids: list[list[int] | None] = [None] * len(texts)
        for special in (True, False):  # one tokenizer call per flavour: fast tokenizers batch well
            picked = [
                i
                for i, (text, s) in enumerate(texts)
                if s == special and len(text) <= self.report.char_limit  # longer: dropped untokenised
            ]
            if picked:
                encoded = tokenizer([texts[i][0] for i in picked], add_special_tokens=special)["input_ids"]
                for i, row_ids in zip(picked, encoded):
                    ids[i] = list(row_ids)
        rows = []
        for (raw, prompt), (text, _), row_ids in zip(candidates, texts, ids):
            if row_ids is None or len(row_ids) > self.max_prompt_length:
                self.report.too_long.append((raw.where, None if row_ids is None else len(row_ids)))
                continue
            rows.append(_row(raw, prompt, text, row_ids))
        return rows

    def _report(self, prompt_key: str, filter_overlong: bool) -> None:
        r, key = self.report, self.config_key
        too_long, needed = self._too_long_phrase(), r.needed_prompt_length(self.max_prompt_length)
        if r.too_long and not filter_overlong:
            raise DataError(
                f"{key}: {too_long}; raise data.max_prompt_length to at least {needed} "
                "or set data.filter_overlong_prompts=true to drop them"
            )
        if not self.rows:
            raise DataError(self._nothing_usable(prompt_key, too_long))
        if r.malformed:
            problems = "; ".join(
                f"{problem} ({len(rows)}: {_first(rows)})" for problem, rows in r.malformed.items()
            )
            log.warning("%s: skipped %d malformed of %d rows: %s", key, r.n_malformed, r.rows_read, problems)
        if r.too_long:
            log.warning("%s: dropped %s; raise data.max_prompt_length to keep them", key, too_long)

    def _too_long_phrase(self) -> str:
        """How many prompts were too long, how long, and which, per file."""
        rows = self.report.too_long
        if not rows:
            return ""
        counted = [n for _, n in rows if n is not None]
        sizes = [f"longest {max(counted)}"] if counted else []
        if len(counted) < len(rows):
            sizes.append(
                f"{len(rows) - len(counted)} over {self.report.char_limit} characters, not tokenised"
            )
        return (
            f"{_count(len(rows), 'prompt')} longer than data.max_prompt_length={self.max_prompt_length} tokens "
            f"({'; '.join(sizes)}) in {per_file([where for where, _ in rows], _SHOWN_ROWS)}"
        )

    def _nothing_usable(self, prompt_key: str, too_long: str) -> str:
        r = self.report
        names = ", ".join(r.files)
        if not r.rows_read:
            return f"{self.config_key}: no rows in {names}; the files are empty"
        found = [
            f"{_count(len(rows), 'row')}: {problem} ({_first(rows)})" for problem, rows in r.malformed.items()
        ]
        fixes = []
        if _NO_TRUTH in r.malformed:
            fixes.append(
                "give every row a reward_model.ground_truth (or set reward.function.path to a reward "
                "function that needs none)"
            )
        if set(r.malformed) - {_NO_TRUTH}:
            fixes.append(
                f"give every row a {prompt_key!r} (a chat list of {{role, content}} or a non-empty string; set "
                "data.prompt_key if the column has another name)"
            )
        if too_long:
            found.append(too_long)
            fixes.append(
                f"raise data.max_prompt_length to at least {r.needed_prompt_length(self.max_prompt_length)}"
            )
        return (
            f"{self.config_key}: no usable prompt in {names} ({r.rows_read} rows read): {'; '.join(found)}. "
            f"Fix: {'; '.join(fixes)}"
        )


def _row(raw: RawRow, prompt: Any, text: str, ids: list[int]) -> PromptRow:
    row = raw.value
    assert isinstance(row, dict)
    reward_model = row.get("reward_model") or {}
    ground_truth = _ground_truth(row)
    ability = row.get("ability")
    return PromptRow(
        where=raw.where,
        prompt_ids=ids,
        prompt_text=text,
        raw_prompt=as_messages(_plain(prompt)),
        data_source=str(row.get("data_source") or ""),
        ground_truth=ground_truth,
        reward_model=reward_model,
        extra_info=row.get("extra_info") or {},
        ability=None if ability is None else str(ability),
    )


def _ground_truth(row: dict[str, Any]) -> Any:
    """`reward_model.ground_truth`, else a top-level `ground_truth` (None: the row has none)."""
    reward_model = row.get("reward_model") or {}
    truth = reward_model.get("ground_truth")
    return truth if truth is not None else row.get("ground_truth")


def _plain(prompt: Any) -> str | Messages:
    return prompt if isinstance(prompt, str) else list(prompt)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("s" if n != 1 else "")


def _first(rows: Sequence[str]) -> str:
    shown = ", ".join(rows[:_SHOWN_ROWS])
    return shown + (f", ... ({len(rows) - _SHOWN_ROWS} more)" if len(rows) > _SHOWN_ROWS else "")


def _objects(values: list[Any]) -> np.ndarray:
    # Filled one by one: numpy would turn a list of equal-length lists into a 2-D array.
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column
