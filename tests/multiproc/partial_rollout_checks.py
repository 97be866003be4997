"""Rank code for test_partial_rollout: a weight sync in the middle of generation, on the engine of
vllm_rollout_checks' `single` part (one rank, tp_g=1; it calls `check_partial` with the engine holding
the tiny Qwen2's own weights).

The sampling stops at a token chosen so that some samples end before the sync and the others run past
it. Three generate calls from the same seeds: the one-call path, the step-by-step path whose callback
never changes anything, and one whose callback loads the perturbed Qwen2 after SYNC_AFTER steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import torch

from megarl.protocol import Batch
from tests.multiproc.vllm_rollout_checks import RESPONSE, hf_log_probs, hf_model, max_diff

SYNC_AFTER = 4  # engine steps before the sync: every sample has this many tokens by then


def stop_token(out: Batch) -> int:
    """The token that appears in the first SYNC_AFTER - 1 positions of the most samples, but not of all."""
    counts = Counter(t for row in out["responses"][:, : SYNC_AFTER - 1].tolist() for t in set(row))
    token, rows = counts.most_common(1)[0]
    assert rows < len(out), "every sample would stop before the sync"
    return token


def check_partial(rollout, batch: Batch, model: str, perturbed: str) -> dict:
    res: dict = {}
    started = time.perf_counter()
    step = rollout.sampling_step
    probe = rollout.generate(batch, rollout.cfg.rollout)
    sampling = dataclasses.replace(rollout.cfg.rollout, stop_token_ids=[stop_token(probe)])
    new_weights = [(n, w.detach()) for n, w in hf_model(perturbed).named_parameters()]

    rollout.sampling_step = step
    t0 = time.perf_counter()
    one_call = rollout.generate(batch, sampling)
    res["one_call_s"] = time.perf_counter() - t0

    rollout.sampling_step, calls = step, []
    t0 = time.perf_counter()
    quiet = rollout.generate(batch, sampling, between_steps=lambda: calls.append(1))
    res["stepwise_s"], res["steps"] = time.perf_counter() - t0, len(calls)
    res["quiet"] = {
        "same_tokens": bool(torch.equal(quiet["responses"], one_call["responses"])),
        "same_log_probs": bool(torch.equal(quiet["rollout_log_probs"], one_call["rollout_log_probs"])),
        "same_finish": list(quiet["finish_reason"]) == list(one_call["finish_reason"]),
        "versions_zero_on_tokens": bool(
            torch.equal(quiet["rollout_token_versions"], one_call["response_mask"].long() - 1)
        ),
        "version_after": rollout.weights_version,
    }

    def sync_once() -> int | None:
        calls.append(1)
        if len(calls) != SYNC_AFTER:
            return None
        t0 = time.perf_counter()
        rollout.load_weights(new_weights)
        res["sync_s"] = time.perf_counter() - t0
        return 1

    rollout.sampling_step, calls = step, []
    synced = rollout.generate(batch, sampling, between_steps=sync_once)
    res["version_after"] = rollout.weights_version

    lengths = synced["response_mask"].sum(1).long()
    positions = torch.arange(RESPONSE)
    before = positions < SYNC_AFTER
    expected_versions = (
        torch.where(before, 0, 1)
        .expand_as(synced["responses"])
        .masked_fill(positions >= lengths[:, None], -1)
    )
    ran_past = lengths > SYNC_AFTER
    res["lengths"] = lengths.tolist()
    res["finish_reason"] = list(synced["finish_reason"])
    res["rows_finished_before_sync"] = int((~ran_past).sum())
    res["rows_across_sync"] = int(ran_past.sum())
    res["versions_as_expected"] = bool(torch.equal(synced["rollout_token_versions"], expected_versions))
    res["row_versions"] = synced["rollout_version"].tolist()

    engine = synced["rollout_log_probs"]
    old, new = hf_log_probs(hf_model(model), synced), hf_log_probs(hf_model(perturbed), synced)
    on_tokens = synced["response_mask"].bool()
    res["before_sync_vs_old_model"] = max_diff(engine[:, :SYNC_AFTER], old[:, :SYNC_AFTER])
    after = on_tokens & ~before
    res["after_sync_vs_new_model"] = max_diff(engine[after], new[after])
    res["after_sync_vs_old_model"] = max_diff(engine[after], old[after])  # far off: the weights did change

    finished = ~ran_past
    res["finished_rows_untouched"] = all(
        torch.equal(synced[k][finished], one_call[k][finished]) for k in ("responses", "rollout_log_probs")
    )
    res["tokens_before_sync_kept"] = bool(
        torch.equal(synced["responses"][:, :SYNC_AFTER], one_call["responses"][:, :SYNC_AFTER])
    )
    res["faults"] = check_faults(rollout, batch, sampling)
    res["check_s"] = time.perf_counter() - started  # what these checks add to the launch
    return res


def check_faults(rollout, batch: Batch, sampling) -> dict:
    """A callback that raises, and one that returns a version not newer than the engine's: the error
    reaches the caller, the requests are aborted, and the next call generates as usual."""
    from megarl.errors import MegarlError

    res: dict = {}
    faults = {"raises": RuntimeError("weight receive failed"), "stale_version": None}
    for label, error in faults.items():
        calls: list = []

        def callback(error=error, calls=calls) -> int | None:
            calls.append(1)
            if len(calls) < 2:
                return None
            if error is not None:
                raise error
            return rollout.weights_version

        try:
            rollout.generate(batch, sampling, between_steps=callback)
            res[label] = {"raised": None}
        except (RuntimeError, MegarlError) as e:
            res[label] = {"raised": f"{type(e).__name__}: {e}"}
        res[label]["engine_idle"] = not rollout.llm.llm_engine.has_unfinished_requests()
    res["generates_after"] = len(rollout.generate(batch, sampling, between_steps=lambda: None))
    return res
