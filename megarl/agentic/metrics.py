"""The step metrics of a multi-turn rollout, from its agent columns (`megarl.agentic.multi_turn`)."""

from __future__ import annotations

from collections import Counter

from megarl.protocol import Batch

# the per-row columns of a multi-turn rollout (megarl.agentic.multi_turn), besides turn_rewards
AGENT_TENSOR_COLUMNS = (
    "num_turns",
    "tool_calls",
    "tool_errors",
    "agent_reward",
    "split_index",
    "token_exact",
)
AGENT_COLUMNS = (*AGENT_TENSOR_COLUMNS, "agent_outcomes")


def agent_metrics(batch: Batch) -> dict[str, float]:
    """agent/turns/mean, agent/tool_calls/mean, agent/tool_errors/<outcome> (counts in the batch),
    agent/split_samples (rows whose conversation was split), agent/token_exact (share of rows whose
    trained tokens equal the engine's: 1.0 by construction)."""
    if "num_turns" not in batch:
        return {}
    n = max(len(batch), 1)
    metrics = {
        "agent/turns/mean": float(batch["num_turns"].float().mean()),
        "agent/turns/max": float(batch["num_turns"].max()),
        "agent/tool_calls/mean": float(batch["tool_calls"].float().mean()),
        "agent/tool_calls/total": float(batch["tool_calls"].sum()),
        "agent/tool_errors/total": float(batch["tool_errors"].sum()),
        "agent/split_samples": float((batch["split_index"] > 0).sum()),
        "agent/token_exact": float(batch["token_exact"].float().sum()) / n,
    }
    outcomes: Counter = Counter()
    for counts in batch["agent_outcomes"]:
        outcomes.update(counts)
    for outcome, count in sorted(outcomes.items()):
        if outcome != "ok":
            metrics[f"agent/tool_errors/{outcome}"] = float(count)
    return metrics
