"""`RewardComputer`: the one entry the trainer calls to turn a rollout Batch into one reward per response.

    rewards = RewardComputer.from_config(cfg, tokenizer)
    rewards.check_data_sources(train_dataset.data_sources)   # at start-up: unknown data_source -> error
    scores, metrics = rewards.score(batch)                    # scores [n] float32, metrics {name: float}

The reward of a response is the weighted sum (`reward.weights`, default 1.0 each) of its terms:

  function   the rule reward registered for the row's `data_source` (`megarl.rewards.registry`), or the
             user's `reward.function` for every row; called as verl calls it, with keyword arguments
             data_source, solution_str (the decoded response), ground_truth, extra_info
  rm         the reward model's `rm_scores` column, when the batch has one (a reward worker wrote it)
  <column>   any other name in reward.weights: the batch's [n] tensor column of that name

plus DAPO's overlong penalty when `reward.overlong_buffer.enable`, on the response's length in generated
tokens (response_mask 1: a multi-turn response's tool outputs and user turns do not count). The function runs in reward worker
processes (`megarl.rewards.pool`; `reward.workers`), each call within `reward.timeout_s`. A row whose call
raises, calls `sys.exit`/`os._exit`, crashes its process, times out or returns no finite number scores 0
for the term and counts in `reward/errors`; the first failure is logged once per RewardComputer, with its
traceback. A step where more than `reward.max_error_fraction` of the rows fail, or every row, stops the
run with `RewardFunctionError` naming the function and the first failure. `close()` stops the workers.

The batch needs `responses` [n, R] and `response_mask` (else `attention_mask`, whose last R columns
cover the response), or a non-tensor `response_text` column; and the non-tensor `data_source`,
`ground_truth` (else verl's `reward_model` dicts) and optionally `extra_info` columns that
`megarl.data.PromptDataset` batches carry through the rollout.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from megarl.config.schema import MegarlConfig, RewardModelConfig
from megarl.protocol import Batch, Col
from megarl.rewards.calls import Failed, Outcome, call_reward
from megarl.rewards.custom import RewardError, RewardFunctionError, load_reward_function
from megarl.rewards.function_check import check_reward_file
from megarl.rewards.overlong import overlong_penalty
from megarl.rewards.pool import FunctionSpec, RewardPool
from megarl.rewards.registry import (
    RewardFn,
    RuleRewards,
    default_compute_score,
    known_data_sources,
    reward_for,
)

log = logging.getLogger("megarl.rewards")

FUNCTION, RM = "function", "rm"


class RewardComputer:
    """Scores rollout Batches; see the module doc."""

    def __init__(
        self,
        reward: RewardModelConfig,
        tokenizer: PreTrainedTokenizerBase | None,
        max_response_length: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.weights = dict(reward.weights)
        self.function: RewardFn | None = None
        self.function_desc = "the rule reward"
        self._spec: FunctionSpec | None = None  # how a reward worker finds the function
        self.timeout_s = reward.timeout_s
        self.max_error_fraction = reward.max_error_fraction
        self.workers = default_workers() if reward.workers is None else reward.workers
        if reward.function.path:
            # imported and its signature checked in a process of its own: a crash at import fails here
            check_reward_file(reward.function.path, reward.function.name)
            self.function_desc = f"reward function {reward.function.name} from {reward.function.path}"
            self._spec = FunctionSpec.file(reward.function.path, reward.function.name)
            if self.workers == 0:  # the user chose the driver process: import it here
                self.function = load_reward_function(reward.function.path, reward.function.name)
        self._pool: RewardPool | None = None
        self.overlong = reward.overlong_buffer
        if self.overlong.enable and max_response_length is None:
            raise ValueError("reward.overlong_buffer.enable=true needs the max_response_length")
        self.max_response_length = max_response_length
        self.first_error: str | None = None  # the first row failure (logged once, with its traceback)

    def use_function(self, fn: RewardFn, description: str) -> None:
        """Score every row with `fn` (verl's signature) instead of the rule rewards; it reaches the reward
        workers pickled by value (cloudpickle), or runs in this process when it cannot be pickled."""
        self.close()
        self.function, self.function_desc, self._spec = fn, description, None

    @property
    def custom_function(self) -> bool:
        """Whether a function of the user's (reward.function, or `use_function`) scores every row."""
        return self.function is not None or (self._spec is not None and self._spec.kind == "file")

    @property
    def needs_ground_truth(self) -> bool:
        """Whether the rows need a ground truth: the rule rewards compare the answer with it."""
        return self.weight(FUNCTION) != 0 and not self.custom_function

    def start(self) -> None:
        """Start the reward worker processes now (else the first `score` does): they load the function
        while the caller goes on, e.g. while the model workers start."""
        pool = self._workers() if self.weight(FUNCTION) != 0 else None
        if pool is not None:
            pool.start()

    def close(self) -> None:
        """Stop the reward worker processes (started again on the next `score`)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @classmethod
    def from_config(cls, cfg: MegarlConfig, tokenizer: PreTrainedTokenizerBase | None) -> RewardComputer:
        limit = cfg.rollout.max_tokens or cfg.data.max_response_length
        return cls(cfg.reward, tokenizer, limit)

    def weight(self, term: str) -> float:
        return float(self.weights.get(term, 1.0))

    def reads(self, reward_model: bool) -> tuple[str, ...]:
        """The columns `score` reads, so that the reward stage declares its every input: the response and
        the rows' data_source, ground_truth and extra_info for the function term, the response for the
        overlong penalty, `rm_scores` when the reward model's term counts (`reward_model`: a reward model
        writes it), and every other column reward.weights names. (`score` also accepts a batch with verl's
        `reward_model` dicts instead of `ground_truth`, or a `response_text` column; the trainer's batches
        carry the columns named here.)"""
        response = (Col.RESPONSES, Col.RESPONSE_MASK)
        columns: tuple[str, ...] = ()
        if self.weight(FUNCTION) != 0:
            columns = (*response, Col.DATA_SOURCE, Col.GROUND_TRUTH, Col.EXTRA_INFO)
        elif self.overlong.enable:
            columns = response
        if self.weight(RM) != 0 and (reward_model or RM in self.weights):
            columns += (Col.RM_SCORES,)
        return columns + self.column_terms

    @property
    def column_terms(self) -> tuple[str, ...]:
        """The batch columns reward.weights adds as terms (besides function and rm): a stage the user
        adds before the reward writes each."""
        return tuple(n for n, w in self.weights.items() if n not in (FUNCTION, RM) and w != 0)

    def check_data_sources(self, data_sources: Iterable[str], where: str = "the batch") -> None:
        """Raise `RewardError` when a data_source has no reward and no reward.function is set; call it on
        the datasets' `data_sources` before training starts."""
        if self.custom_function or self.weight(FUNCTION) == 0:
            return
        for source in data_sources:
            if reward_for(source) is None:
                raise RewardError(_unknown_source(source, where))

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """(reward [n] float32, metrics): the weighted sum of the terms, plus the overlong penalty."""
        n = len(batch)
        total = torch.zeros(n, dtype=torch.float32)
        metrics: dict[str, float] = {}
        if self.weight(FUNCTION) != 0:
            term, extra = self._function_term(batch)
            total += self.weight(FUNCTION) * term
            metrics[f"reward/{FUNCTION}/mean"] = _mean(term)
            metrics.update(extra)
        for name, weight in self._column_terms(batch):
            term = batch["rm_scores" if name == RM else name].float().reshape(n)
            total += weight * term
            metrics[f"reward/{name}/mean"] = _mean(term)
        if self.overlong.enable:
            assert self.max_response_length is not None
            penalty = overlong_penalty(
                _response_lengths(batch),
                self.max_response_length,
                self.overlong.len,
                self.overlong.penalty_factor,
            )
            total += penalty
            metrics["reward/overlong_penalty/mean"] = _mean(penalty)
            metrics["reward/overlong/frac"] = _mean((penalty < 0).float())
        metrics["reward/mean"] = _mean(total)
        metrics["reward/std"] = float(total.std(unbiased=False)) if n else 0.0
        return total, metrics

    def response_texts(self, batch: Batch) -> list[str]:
        """Each row's response as text: the `response_text` column, else the decoded response tokens
        (special tokens such as EOS dropped, as verl decodes them). Only the generated ones (response_mask):
        in a multi-turn response the tool outputs are left out, so a tool's result cannot pass for the
        model's answer (verl's reward managers decode them with the rest)."""
        if "response_text" in batch.non_tensors:
            return [str(t) for t in batch["response_text"]]
        if self.tokenizer is None:
            raise ValueError("decoding responses needs a tokenizer; pass one to RewardComputer")
        responses = batch["responses"]
        mask = _response_mask(batch).bool()
        ids = [row[m].tolist() for row, m in zip(responses, mask)]
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def _column_terms(self, batch: Batch) -> list[tuple[str, float]]:
        terms = []
        if self.weight(RM) != 0 and "rm_scores" in batch.tensors.keys():
            terms.append((RM, self.weight(RM)))
        elif RM in self.weights and self.weight(RM) != 0:
            raise RewardError(
                f"reward.weights.rm={self.weight(RM)} but the batch has no rm_scores column; enable the reward "
                "model (reward.model_path=...) or remove reward.weights.rm"
            )
        for name, weight in self.weights.items():
            if name in (FUNCTION, RM) or weight == 0:
                continue
            if name not in batch.tensors.keys():
                raise RewardError(
                    f"reward.weights.{name}={weight} names a reward term, but the batch has no {name!r} column; "
                    f"terms are function, rm or a tensor column an added stage writes (columns: {batch.keys()})"
                )
            terms.append((name, float(weight)))
        return terms

    def _function_term(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n = len(batch)
        sources = _column(batch, "data_source", n, "")
        truths = _ground_truths(batch, n)
        infos = _column(batch, "extra_info", n, None)
        if not self.custom_function:
            for row, source in enumerate(sources):
                if reward_for(str(source)) is None:
                    raise RewardError(_unknown_source(str(source), _row_name(batch, row)))
        texts = self.response_texts(batch)
        calls = [
            {
                "data_source": sources[row],
                "solution_str": texts[row],
                "ground_truth": truths[row],
                "extra_info": infos[row],
            }
            for row in range(n)
        ]
        outcomes = self._call(calls, batch)
        scores = torch.zeros(n, dtype=torch.float32)
        extras: dict[str, list[float]] = defaultdict(list)
        by_source: dict[str, list[float]] = defaultdict(list)
        errors = 0
        for row, outcome in enumerate(outcomes):
            value = 0.0
            if isinstance(outcome, Failed):
                errors += 1
            else:
                value = outcome.value
                for key, v in outcome.extras.items():
                    extras[key].append(v)
            scores[row] = value
            by_source[str(sources[row])].append(value)
        metrics = {f"reward/{key}/mean": float(np.mean(v)) for key, v in extras.items()}
        if len(by_source) > 1:
            metrics.update(
                {f"reward/source/{s}/mean": float(np.mean(v)) for s, v in sorted(by_source.items())}
            )
        metrics["reward/errors"] = float(errors)
        return scores, metrics

    def _call(self, calls: list[dict[str, Any]], batch: Batch) -> list[Outcome]:
        """Each row's outcome, from the reward workers (or this process, reward.workers=0); stops the
        run when more than reward.max_error_fraction of the rows fail, or all of them."""
        n = len(calls)
        if n == 0:
            return []
        allowed = int(self.max_error_fraction * n)
        failed: list[int] = []

        def stop(row: int, failure: Failed) -> bool:
            failed.append(row)
            if self.first_error is None:
                self.first_error = failure.summary
                self._log_failure(batch, row, str(calls[row]["data_source"]), failure)
            return len(failed) > allowed or len(failed) == n

        pool = self._workers()
        outcomes: list[Outcome | None]
        if pool is not None:
            outcomes = pool.run(calls, stop)
        else:
            if self.function is None and self._spec is not None and self._spec.kind == "file":
                self.function = self._spec.load()  # a file's function that workers were to run
            fn = self.function or default_compute_score
            outcomes = []
            for kwargs in calls:
                outcome = call_reward(fn, kwargs)
                outcomes.append(outcome)
                if isinstance(outcome, Failed) and stop(len(outcomes) - 1, outcome):
                    break
        if len(failed) > allowed or len(failed) == n:
            first = outcomes[failed[0]]
            assert isinstance(first, Failed)
            done = sum(o is not None for o in outcomes)
            counted = f"{len(failed)} of {n}" if done == n else f"{len(failed)} of the first {done} of {n}"
            raise RewardFunctionError(
                f"{self.function_desc} failed on {counted} rows of this step (reward.max_error_fraction="
                f"{self.max_error_fraction:g} allows {allowed}); the first, {_row_name(batch, failed[0])} "
                f"(data_source {calls[failed[0]]['data_source']!r}): {first.summary}. Fix the function (its first "
                "failure is logged above with the traceback), or raise reward.max_error_fraction to train on with failed rows "
                "scored 0"
            )
        return [o if o is not None else Failed("not scored") for o in outcomes]

    def _workers(self) -> RewardPool | None:
        """The reward worker pool (started on first use); None: call in this process (reward.workers=0,
        or a function that cannot be pickled)."""
        if self._pool is not None or self.workers == 0:
            return self._pool
        if self._spec is None:
            try:
                self._spec = FunctionSpec.pickled(self.function or RuleRewards())
            except Exception as e:  # a closure over a lock, an open file, ...
                log.warning(
                    "%s cannot be sent to reward worker processes (%s: %s); it runs in the driver process, "
                    "without reward.timeout_s and unprotected from sys.exit/os._exit/crashes",
                    self.function_desc,
                    type(e).__name__,
                    e,
                )
                self.workers = 0
                return None
        self._pool = RewardPool(self._spec, self.workers, self.timeout_s or None, self.function_desc)
        return self._pool

    def _log_failure(self, batch: Batch, row: int, source: str, failure: Failed) -> None:
        detail = f"\n{failure.detail}" if failure.detail else ""
        log.warning(
            "%s failed on %s (data_source %r): %s; that row scores 0 and counts in reward/errors (later "
            "failures are only counted).%s",
            self.function_desc,
            _row_name(batch, row),
            source,
            failure.summary,
            detail,
        )


def default_workers() -> int:
    """reward.workers=None: up to 4, sharing this machine's CPUs with the other processes that score
    (under torchrun every rank on the node runs the driver loop, rewards included)."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(4, len(os.sched_getaffinity(0)) // max(1, local_ranks)))


def _unknown_source(source: str, where: str) -> str:
    return (
        f"no reward for data_source {source!r} ({where}) and reward.function.path is not set; set "
        "reward.function.path=/path/to/reward.py (defining compute_score(data_source, solution_str, "
        f"ground_truth, extra_info=None)) or use a known data_source: {', '.join(known_data_sources())} "
        "(or any name starting with 'aime' or containing 'countdown')"
    )


def _row_name(batch: Batch, row: int) -> str:
    if "index" in batch.tensors.keys():
        return f"batch row {row}, dataset row {int(batch['index'][row])}"
    return f"batch row {row}"


def _column(batch: Batch, key: str, n: int, default: Any) -> list[Any]:
    return list(batch[key]) if key in batch.non_tensors else [default] * n


def _ground_truths(batch: Batch, n: int) -> list[Any]:
    if "ground_truth" in batch.non_tensors:
        return list(batch["ground_truth"])
    if "reward_model" in batch.non_tensors:
        return [rm.get("ground_truth") if isinstance(rm, dict) else None for rm in batch["reward_model"]]
    return [None] * n


def _response_mask(batch: Batch) -> torch.Tensor:
    if "response_mask" in batch.tensors.keys():
        return batch["response_mask"]
    width = batch["responses"].shape[1]
    return batch["attention_mask"][:, -width:]


def _response_lengths(batch: Batch) -> torch.Tensor:
    """Each response's generated tokens: the overlong penalty's length."""
    if "responses" in batch.tensors.keys():
        return _response_mask(batch).sum(dim=1)
    raise ValueError("the overlong penalty needs response lengths: a responses/response_mask column")


def _mean(t: torch.Tensor) -> float:
    return float(t.float().mean()) if t.numel() else 0.0
