"""`megarl bench train --backend fsdp`: megarl's FSDP actor (`FSDPActorWorker`, FSDP2 over this one
rank) beside its Megatron actor and transformers eager, in the same rank process, on the same
checkpoint, batch, config (but `actor.backend`) and timing; each side's peak memory
(megarl.bench.memory says how it is measured). The two actors start from the same weights, so their
first updates' pg_loss and grad_norm agree (the check that they do the same work is the JSON's
`first_update`, asserted by the test).
"""

from __future__ import annotations

from megarl.bench.measure import spread, spread_text
from megarl.bench.memory import PeakMemory


def fsdp_side(args, batch) -> dict:
    """Time FSDP's `update(batch)` as the Megatron side's is timed; the actor is released after."""
    from megarl.bench.train import actor_config, time_actor
    from megarl.workers.fsdp_roles import FSDPActorWorker

    memory = PeakMemory()
    memory.start()
    _, timed = time_actor(FSDPActorWorker, actor_config(args, "fsdp"), args, batch, memory)
    return timed


def _first(update: dict) -> dict:
    return {"pg_loss": float(update["actor/pg_loss"]), "grad_norm": float(update["grad_norm"])}


def summary(fsdp: dict, megatron: dict, tokens: int) -> dict:
    """The result's "fsdp" entry: FSDP's times, tokens/s, its ratio to Megatron's, both first updates."""
    f, m = spread(fsdp["seconds"]), spread(megatron["seconds"])
    return {
        **f,
        "tokens_per_s": tokens / f["median"],
        "raw": fsdp["seconds"],
        "ratio_tokens_per_s_vs_megatron": m["median"] / f["median"],
        "page_faults": fsdp["page_faults"],
        "first_update": {"megatron": _first(megatron["first_update"]), "fsdp": _first(fsdp["first_update"])},
    }


def _mib(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**20:,.0f}"


def table(result: dict) -> str:
    """The FSDP section under the Megatron/transformers table, for the sizes run with --backend fsdp."""
    rows = {name: r for name, r in result["sizes"].items() if "fsdp" in r}
    if not rows:
        return ""
    lines = [
        "",
        "## FSDP actor beside Megatron — same model, batch and update; peak memory of each side",
        "",
        "| size | FSDP s | FSDP tok/s | Megatron tok/s | FSDP/Megatron tok/s "
        "| peak MiB Megatron / FSDP / transformers | method | first update pg_loss, grad norm: Megatron / FSDP |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        f, mem = r["fsdp"], r["memory"]
        first = f["first_update"]
        peaks = " / ".join(_mib(mem[side]["peak_bytes"]) for side in ("megatron", "fsdp", "transformers"))
        lines.append(
            f"| {name} ({r['params'] / 1e6:.2f}M) | {spread_text(f, '{:.3f}')} | {f['tokens_per_s']:.0f} "
            f"| {r['megatron']['tokens_per_s']:.0f} | **{f['ratio_tokens_per_s_vs_megatron']:.2f}×** "
            f"| {peaks} | {mem['fsdp']['method']} "
            f"| {first['megatron']['pg_loss']:.6g}, {first['megatron']['grad_norm']:.6g} "
            f"/ {first['fsdp']['pg_loss']:.6g}, {first['fsdp']['grad_norm']:.6g} |"
        )
    return "\n".join(lines) + "\n"
