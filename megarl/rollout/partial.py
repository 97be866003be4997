"""Partial rollouts: generation that survives a weight sync between two engine steps.

`generate_across_syncs` drives an in-process vLLM engine one step at a time and calls `between_steps()`
after every step. The callback returns None (nothing changed) or the version of the weights it has just
loaded into the engine (`VLLMRollout.load_weights`). On a new version the unfinished requests are kept,
not aborted: vLLM's `reset_prefix_cache(reset_running_requests=True)` preempts them and empties the
cache, so the next step recomputes each one's KV from its prompt and the tokens it has so far with the
new weights, then samples on. A request keeps its seeded generator (its random stream continues where it
was), its `max_tokens` budget counts every token it produced, and its tokens sampled before the sync keep
the log-probs the old weights gave them. Each token also records the weights version that sampled it.

vLLM 0.32's `keep` pause (`LLM.sleep(level=0, mode="keep")`) also works in-process on CPU, but it only
stops the scheduler and keeps the old weights' KV; in this loop the engine does not step while the
callback runs anyway, so the preemption above is the pause that matters.

The callback is entered once per engine step. Engines of one replica (its TP ranks, external-launcher
mode) step in lockstep, so every rank calls it at the same step; the caller must make every rank return
the same answer (decide on one rank and broadcast inside the callback, or let the decision come from the
collective weight receive itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from megarl.errors import MegarlError
from megarl.rollout.base import Sample

# Called after each engine step: None, or the version of the weights it has just loaded.
BetweenSteps = Callable[[], "int | None"]


@dataclass
class _Stream:
    """One sample as it grows: its tokens and, per token, the engine's log-prob and weights version."""

    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def sample(self, log_probs: bool) -> Sample:
        return Sample(
            token_ids=self.tokens,
            log_probs=self.log_probs if log_probs else None,
            finish_reason=self.finish_reason or "length",
            versions=self.versions,
        )


def generate_across_syncs(
    llm,
    prompts: Sequence[list[int]],
    params: Sequence,
    between_steps: BetweenSteps,
    version: int,
    log_probs: bool = True,
    engine_guard: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    lora_request=None,
) -> tuple[list[list[Sample]], int]:
    """Generate `params[i]` (a `vllm.SamplingParams`, `n` samples) for each prompt `prompts[i]` (token
    ids) on `llm`, calling `between_steps()` after every engine step. `version` is the engine's weights
    version at the start. Every call into the engine runs under `engine_guard()`, the callback outside
    it (it sees the caller's RNG, threads and CPU shims); every request carries `lora_request` (a
    `vllm.lora.request.LoRARequest`, None for the base model). Returns each prompt's samples in order, each
    with per-token `versions`, and the version the engine holds at the end."""
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    if engine.has_unfinished_requests():
        raise MegarlError(
            "the vLLM engine still has unfinished requests from an earlier call; a partial rollout "
            "needs an idle engine (was a generate call interrupted? abort its requests first)"
        )
    prompt_of: dict[str, int] = {}  # request id → prompt
    streams = [[_Stream() for _ in range(p.n)] for p in params]
    try:
        with engine_guard():
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                p.output_kind = RequestOutputKind.DELTA  # each step reports only its new tokens
                request_id = str(next(llm.request_counter))
                prompt_of[request_id] = i
                engine.add_request(request_id, {"prompt_token_ids": prompt}, p, lora_request=lora_request)
        while engine.has_unfinished_requests():
            with engine_guard():
                outputs = engine.step()
            for out in outputs:
                for c in out.outputs:
                    stream = streams[prompt_of[out.request_id]][c.index]
                    stream.tokens.extend(c.token_ids)
                    stream.versions.extend([version] * len(c.token_ids))
                    if log_probs:
                        stream.log_probs.extend(lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids))
                    if c.finish_reason is not None:
                        stream.finish_reason = c.finish_reason
            new = between_steps()
            if new is not None:
                if new <= version:
                    raise MegarlError(
                        f"between_steps returned weights version {new}, not newer than the engine's "
                        f"{version}; return None when nothing changed"
                    )
                version = new
                # load_weights already did this; a no-op then, and the guarantee if the new weights
                # came another way: no KV from the old weights is reused.
                with engine_guard():
                    llm.reset_prefix_cache(reset_running_requests=True)
    except BaseException:
        if engine.has_unfinished_requests():
            with engine_guard():
                engine.abort_request(list(prompt_of))  # with their n>1 samples
        raise
    return [[s.sample(log_probs) for s in per_prompt] for per_prompt in streams], version
