"""VLLMRollout: a vLLM engine inside the training process, one per generation tensor-parallel group.

Every rank builds its own in-process `vllm.LLM` (no engine subprocesses) in vLLM's external-launcher
mode; the ranks of one generation TP group form one engine replica and must call `generate` with the
same prompts, the way the generation-layout dispatch hands them out. The groups are given (the
3D-HybridEngine's plan, e.g. strided [[0, 2], [1, 3]]) rather than vLLM's consecutive ones. Weights
come from the HF checkpoint at start-up and are replaced in place by `load_weights` after each sync.
With LoRA in the rollout spec, the policy's adapter comes from memory through `load_adapter`
(`megarl.rollout.vllm_lora`), and every request then runs with it. A mixture-of-experts checkpoint gets
`megarl.rollout.vllm_moe`'s fix for weight updates on CPU and, with `return_routes` in the spec (R3), the
routes of every token (`Col.ROUTED_EXPERTS`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist

from megarl.config.roles import RolloutSpec
from megarl.config.schema import SamplingConfig, longest_response
from megarl.distributed.platform import platform
from megarl.errors import MegarlError
from megarl.models.dtypes import hf_name
from megarl.protocol import Batch, Col
from megarl.rollout.base import Rollout, Sample, prompt_token_ids, rollout_batch
from megarl.rollout.colocate import engine_call
from megarl.rollout.engine_cache import cached_start
from megarl.rollout.engine_start import before_start
from megarl.rollout.partial import generate_across_syncs
from megarl.rollout.vllm_cpu_load import load_into_layers
from megarl.rollout.vllm_groups import (
    check_tp_groups,
    consecutive_groups,
    engine_tp_ranks,
    given_tp_groups,
    spare_default_process_group,
)
from megarl.rollout.vllm_lora import (
    adapter_request,
    engine_lora_kwargs,
    install_adapter,
    installed_adapter_checksums,
    reinstall_adapter,
)
from megarl.rollout.vllm_moe import (
    expert_layers,
    install_route_recorder,
    is_moe,
    local_expert_ids_on_cpu,
    repack_experts_on_update,
    rollout_routes,
    take_routes,
)

# vLLM logs INFO lines per weight reload and cache reset, every step, from every rank: in a run's log
# (Ray forwards worker output; SLURM files) they drown the progress lines. VLLM_LOGGING_LEVEL=INFO
# brings them back. vLLM reads this when it is first imported, which happens below this module.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

# Log-probs of the distribution actually sampled from (temperature, top-k/top-p applied).
_LOGPROBS_MODE = "processed_logprobs"
# KV-cache block size on CPU (vLLM's CPU default: 128). Its attention kernel walks a sequence's cache
# block by block; at 32 a 25M model's generation (64 sequences × 128 tokens, 1 thread) ran 3% faster
# here, never slower at the tiny model (standalone engines, same prompts).
_CPU_BLOCK_SIZE = 32


def checkpoint_names_by_layer(
    engine_params: Iterable[str], packed: Mapping[str, list[str]]
) -> dict[str, set[str]]:
    """For each engine layer, the Hugging Face names of every tensor that fills it. `engine_params` are
    the engine's parameter names (fused: `qkv_proj.weight`), `packed` the model's fused-layer table
    (`{"qkv_proj": ["q_proj", "k_proj", "v_proj"], ...}`)."""
    layers: dict[str, set[str]] = {}
    for name in engine_params:
        layer, _, suffix = name.rpartition(".")
        parent, _, leaf = layer.rpartition(".")
        prefix = f"{parent}." if parent else ""
        layers.setdefault(layer, set()).update(
            f"{prefix}{part}.{suffix}" for part in packed.get(leaf, [leaf])
        )
    return layers


def check_complete_layers(names: Iterable[str], layers: Mapping[str, set[str]]) -> None:
    """Raise unless each engine layer that `names` touches gets all of its tensors. vLLM reprocesses a
    layer once all of it has arrived; a layer sent in part (q without k and v, weights without the
    bias) is processed with the rest uninitialised and silently corrupts generation."""
    names = set(names)
    layer_of = {hf: layer for layer, hf_names in layers.items() for hf in hf_names}
    missing = set().union(*(layers[layer_of[n]] for n in names if n in layer_of)) - names
    if missing:
        raise ValueError(
            f"load_weights got part of an engine layer; also send {sorted(missing)} in the same call"
        )


def request_seeds(seed: int, replica: int, step: int, n_prompts: int) -> list[int]:
    """One sampling seed per prompt of generate call `step` on generation replica `replica`, which holds
    prompts replica·n_prompts … of the call (the dispatch gives every replica an equal share): prompt i of
    a call gets the same seed whatever the number of replicas (a run resumed on other devices samples what
    it would have), a fresh one at every call, the same on every rank of a replica (so its TP ranks sample
    identical tokens). vLLM gives sample j of a prompt seed + j."""
    first = replica * n_prompts
    states = np.random.SeedSequence([seed, step]).generate_state(first + n_prompts, dtype=np.uint32)
    return [int(s) >> 1 for s in states[first:]]


def sampling_params(sampling: SamplingConfig, max_tokens: int, seed: int, log_probs: bool = True) -> dict:
    """`vllm.SamplingParams`' arguments (JSON values) for one prompt's request; `log_probs`: return
    the sampled tokens' log-probs."""
    return dict(
        n=sampling.n,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=max_tokens,
        stop_token_ids=list(sampling.stop_token_ids),
        stop=list(sampling.stop),
        detokenize=bool(sampling.stop),
        logprobs=0 if log_probs else None,
        seed=seed,
    )


@contextlib.contextmanager
def _log_level(logger: str, level: int) -> Iterator[None]:
    log = logging.getLogger(logger)
    previous = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(previous)


def _engine_layers(worker) -> dict[str, set[str]]:
    model = worker.model_runner.model
    packed = getattr(model, "packed_modules_mapping", {})
    experts = expert_layers(model)  # MoE: one engine layer holds every expert's tensors
    # with LoRA enabled each linear is wrapped, its own parameters under `base_layer`
    names = (name.replace(".base_layer.", ".") for name, _ in model.named_parameters())
    names = (name for name in names if name.rpartition(".")[0] not in experts)
    return {**checkpoint_names_by_layer(names, packed), **experts}


def _reprocess_tied_layers(worker) -> int:
    """Redo the post-load processing of layers that share their weight with another layer (a tied
    lm_head). vLLM's in-place reload skips a layer that received no tensor of its own, so the tied
    lm_head kept kernel state built from the old embedding (the CPU backend's packed GEMM weight):
    its logits silently stayed those of the old weights. Returns how many layers were redone."""
    sharers: dict[int, list] = {}
    for module in worker.model_runner.model.modules():
        weight = module._parameters.get("weight")
        if weight is not None and hasattr(module, "quant_method"):
            sharers.setdefault(id(weight), []).append(module)
    tied = [m for modules in sharers.values() if len(modules) > 1 for m in modules]
    for module in tied:
        module.quant_method.process_weights_after_loading(module)
    return len(tied)


class VLLMRollout(Rollout):
    """vLLM generation for this rank's replica. Needs torch.distributed initialised (all ranks of the
    world create their engine together) and, on CPU, `rollout.kv_cache_memory_bytes`.

    `cfg` is the actor's rollout spec (`megarl.config.roles.rollout_spec(config)`). `tp_groups` lists
    every generation TP group as global ranks (default: runs of `rollout.tp`
    consecutive ranks); all ranks pass the same list.
    """

    def __init__(self, cfg: RolloutSpec, tp_groups: list[list[int]] | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "initialise torch.distributed before creating VLLMRollout "
                "(megarl.distributed.backend.init_distributed); the engine joins its world"
            )
        r = cfg.rollout
        if r.kv_cache_memory_bytes is None and not platform().is_cuda:
            raise ValueError(
                "rollout.kv_cache_memory_bytes must be set on CPU (e.g. 67108864 for 64 MiB); "
                "the memory fraction would reserve that share of host RAM on every rank"
            )
        world, rank = dist.get_world_size(), dist.get_rank()
        groups = tp_groups or consecutive_groups(world, r.tp)
        if check_tp_groups(groups, world) != r.tp:
            raise ValueError(f"generation TP groups {groups} do not have rollout.tp={r.tp} ranks each")
        self.cfg = cfg
        self.tp_groups = [list(g) for g in groups]
        self.replica = next(i for i, g in enumerate(self.tp_groups) if rank in g)
        # Per-request sampling seeds derive from (seed, replica, sampling_step); sampling_step counts
        # generate calls, so restoring both resumes the same seed stream.
        self.seed = cfg.seed
        self.sampling_step = 0
        # The version of the weights the engine holds (the caller's count of syncs; set it after each
        # load_weights between calls). A partial rollout tags every token with it and advances it.
        self.weights_version = 0
        # the adapter every request carries (`load_adapter`); None: the base model alone
        self.lora_request = None
        self.llm = self._start_engine()
        self.pad_token_id = self._pad_token_id()
        self.layers = self.llm.collective_rpc(_engine_layers)[0]
        self.route_shape = self._start_route_recording() if cfg.return_routes else None
        self.multi_turn = None
        if cfg.rollout.multi_turn.enable:
            from megarl.agentic.multi_turn import MultiTurnRollout

            self.multi_turn = MultiTurnRollout(self.llm, cfg, engine_call)

    def _start_engine(self):
        # In-process engine core; the external launcher refuses to run without it.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        if self.cfg.return_routes and platform().is_cuda and not self.cfg.rollout.enforce_eager:
            raise ValueError(
                "recording routes (actor.router_replay.mode=R3) hooks the routers in Python, which CUDA "
                "graphs would skip: set rollout.enforce_eager=true"
            )
        if self.cfg.rollout.expert_parallel_size > 1 and not platform().is_cuda:
            local_expert_ids_on_cpu()
        spare_default_process_group()
        before_start(on_cuda=platform().is_cuda)
        kwargs = self.engine_kwargs
        with engine_call(), given_tp_groups(self.tp_groups), cached_start(kwargs, dist.get_rank() == 0):
            llm = LLM(**kwargs, distributed_executor_backend="external_launcher")
        if is_moe(llm.llm_engine.model_config.hf_config) and not platform().is_cuda:
            repack_experts_on_update()
        return llm

    def _start_route_recording(self) -> tuple[int, int]:
        """Hook the engine's routers (`vllm_moe.RouteRecorder`); returns (MoE layers, top-k)."""
        if not is_moe(self.llm.llm_engine.model_config.hf_config):
            raise ValueError(
                f"the rollout spec asks for routes (R3) but {self.cfg.model.path} is not a mixture-of-experts "
                "model; set actor.router_replay.mode=disabled"
            )
        with engine_call():
            return self.llm.collective_rpc(install_route_recorder)[0]

    @property
    def engine_kwargs(self) -> dict:
        """`vllm.LLM`'s arguments for this spec (JSON values), less the executor backend: what a
        standalone engine needs to run exactly as this one does (`megarl bench rollout`)."""
        cfg, r = self.cfg, self.cfg.rollout
        _, longest = longest_response(r, cfg.max_response_length)
        return dict(
            model=cfg.model.path,
            tokenizer=cfg.model.tokenizer_path or cfg.model.path,
            trust_remote_code=cfg.model.trust_remote_code,
            dtype=hf_name(cfg.model.dtype),
            tensor_parallel_size=r.tp,
            enable_expert_parallel=r.expert_parallel_size > 1,
            seed=self.seed,
            max_model_len=cfg.max_prompt_length + longest,
            max_num_seqs=r.max_num_seqs,
            gpu_memory_utilization=r.gpu_memory_utilization,
            kv_cache_memory_bytes=r.kv_cache_memory_bytes,
            enforce_eager=r.enforce_eager,
            # a prefix-cache hit skips the router of the cached blocks: no routes there (vllm_moe)
            enable_prefix_caching=not cfg.return_routes,
            enable_sleep_mode=self.can_sleep,
            **({} if platform().is_cuda else {"block_size": _CPU_BLOCK_SIZE}),
            # vLLM's CPU sampler computes a log-softmax for this mode every step, asked for or not
            **({"logprobs_mode": _LOGPROBS_MODE} if self.has_log_probs else {}),
            **(engine_lora_kwargs(cfg.lora) if cfg.lora is not None else {}),
        )

    @property
    def has_log_probs(self) -> bool:
        """Whether the engine can return its sampled tokens' log-probs (rollout.calculate_log_probs not
        false): generate(..., log_probs=True) needs it."""
        return self.cfg.rollout.calculate_log_probs is not False

    def _pad_token_id(self) -> int:
        tokenizer = self.llm.get_tokenizer()
        pad = tokenizer.pad_token_id
        return tokenizer.eos_token_id if pad is None else pad

    @property
    def tp_ranks(self) -> list[int]:
        """The global ranks of the TP group this rank's engine actually runs with."""
        return engine_tp_ranks()

    @property
    def can_sleep(self) -> bool:
        """Whether the engine can release its memory between generations (vLLM sleep mode: GPU only)."""
        return platform().is_cuda

    def _request_seeds(self, n_prompts: int) -> list[int]:
        seeds = request_seeds(self.seed, self.replica, self.sampling_step, n_prompts)
        self.sampling_step += 1
        return seeds

    def generate(
        self,
        batch: Batch,
        sampling: SamplingConfig,
        log_probs: bool = True,
        between_steps: Callable[[], int | None] | None = None,
    ) -> Batch:
        """Sample `sampling.n` responses per prompt; see `megarl.rollout.base` for the returned columns.

        With `between_steps` (a partial rollout, `megarl.rollout.partial`) the engine runs step by step
        and calls it after each step, on every rank of the replica at the same step; it returns None or
        the version of the weights it has just loaded (`load_weights`), which must then be the same on
        every rank. Requests in flight continue with the new weights; the batch gains the per-token
        `rollout_token_versions` and per-row `rollout_version`, and `weights_version` ends at the last
        version loaded."""
        from vllm import SamplingParams

        if log_probs and not self.has_log_probs:
            raise ValueError(
                "this engine was built with rollout.calculate_log_probs=false, so it cannot return log-probs"
            )
        max_tokens = sampling.max_tokens or self.cfg.max_response_length
        if self.multi_turn is not None:
            return self._generate_multi_turn(batch, sampling, max_tokens, log_probs, between_steps)
        prompts = prompt_token_ids(batch)
        params = [
            SamplingParams(**sampling_params(sampling, max_tokens, seed, log_probs))
            for seed in self._request_seeds(len(prompts))
        ]
        if between_steps is not None:
            if self.route_shape is not None:
                raise MegarlError("routes (R3) are not recorded across weight syncs (partial rollouts)")
            samples, self.weights_version = generate_across_syncs(
                self.llm,
                prompts,
                params,
                between_steps,
                self.weights_version,
                log_probs,
                engine_call,
                self.lora_request,
            )
            return rollout_batch(batch, samples, max_tokens, self.pad_token_id)
        with engine_call():
            outputs = self.llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                params,
                use_tqdm=False,
                lora_request=self.lora_request,
            )
        samples = [
            [
                Sample(
                    token_ids=list(c.token_ids),
                    log_probs=[lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]
                    if log_probs
                    else None,
                    finish_reason=c.finish_reason,
                )
                for c in sorted(out.outputs, key=lambda c: c.index)
            ]
            for out in outputs
        ]
        result = rollout_batch(batch, samples, max_tokens, self.pad_token_id)
        if self.route_shape is not None:
            with engine_call():
                routes = self.llm.collective_rpc(take_routes)[0]
            result[Col.ROUTED_EXPERTS] = rollout_routes(result, outputs, routes, self.route_shape)
        return result

    def _generate_multi_turn(
        self,
        batch: Batch,
        sampling: SamplingConfig,
        max_tokens: int,
        log_probs: bool,
        between_steps: Callable[[], int | None] | None,
    ) -> Batch:
        """rollout.multi_turn: each sample a conversation run by the agent loop (`megarl.agentic`); every
        turn seeded from the prompt's request seed, the sample and the turn."""
        from vllm import SamplingParams

        assert self.multi_turn is not None
        if between_steps is not None:
            raise MegarlError("multi-turn rollouts cannot take weights mid-generation (partial rollouts)")
        if self.route_shape is not None:
            raise MegarlError("routes (R3) are not recorded for multi-turn rollouts")

        def params_for(seed: int, cap: int, stops: list[int]) -> SamplingParams:
            args = sampling_params(sampling, cap, seed, log_probs)
            args.update(n=1, stop_token_ids=sorted({*args["stop_token_ids"], *stops}))
            return SamplingParams(**args)

        seeds = self._request_seeds(len(batch))
        fields, columns = self.multi_turn.run(
            batch, sampling.n, max_tokens, seeds, params_for, log_probs, self.lora_request
        )
        samples = [[Sample(**f) for f in per_prompt] for per_prompt in fields]
        out = rollout_batch(batch, samples, max_tokens, self.pad_token_id)
        for key, value in columns.items():
            out[key] = value
        return out

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
        """Replace engine weights in place from Hugging Face-named, full (unsharded) tensors.

        Any subset of the model may be sent, in buckets of whole engine layers: every tensor of a layer
        in one call (q, k and v with their biases; gate and up). Each engine takes its own TP shard;
        cached prefixes computed with the old weights are dropped, and requests in flight (a partial
        rollout's `between_steps`) recompute theirs at the next step. Returns the loader that took them:
        "layers" (CPU, one engine TP rank: `vllm_cpu_load`) or "reload_weights" (vLLM's).
        """
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        check_complete_layers((name for name, _ in weights), self.layers)
        with engine_call():
            loader = self._push(weights)
            self.llm.collective_rpc(_reprocess_tied_layers)
            if loader == "reload_weights" and self.lora_request is not None:
                self.llm.collective_rpc(reinstall_adapter)  # vLLM's reload drops every adapter
            # Running requests are preempted (none outside a partial rollout's between_steps): their
            # KV is recomputed with the new weights when they resume.
            if not self.llm.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("vLLM kept its prefix cache; outputs would mix weights")
        return loader

    def _push(self, weights: list[tuple[str, torch.Tensor]]) -> str:
        """The CPU backend repacks linear weights, so the model's own load_weights cannot be used: with
        one engine TP rank the layers take their tensors directly (`vllm_cpu_load`); otherwise, or where
        that declines, the worker's reload_weights undoes and redoes the processing layer by layer."""
        if self.cfg.rollout.tp == 1 and not platform().is_cuda:
            if self.llm.collective_rpc(load_into_layers, args=(weights,))[0]:
                return "layers"
        # vLLM warns once per layer a call leaves alone: in a bucketed push, every other layer
        with _log_level("vllm.model_executor.model_loader.reload.layerwise", logging.ERROR):
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        return "reload_weights"

    def load_adapter(self, tensors: Mapping[str, torch.Tensor], peft_config: Mapping) -> dict:
        """Make `tensors` the adapter every later request runs with, replacing the one before; no files.

        `tensors`: PEFT names (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`) → full
        shapes (A [r, in], B [out, r]); with engine TP > 1 each rank reads only its region
        (`vllm_lora.engine_region`), the rest may be anything. `peft_config`: adapter_config.json's fields
        (r, lora_alpha, target_modules). Cached prefixes computed with the old adapter are dropped;
        requests in flight (a partial rollout's `between_steps`) recompute theirs with the new one.
        Returns {"tensors", "bytes", "seconds"} and vLLM's build/activate seconds."""
        if self.cfg.lora is None:
            raise ValueError(
                "this engine was built without LoRA (its rollout spec has lora=None); adapters can only be "
                "loaded into an engine started with them (actor.lora.rank > 0, sync adapter)"
            )
        start = time.perf_counter()
        with engine_call():
            phases = self.llm.collective_rpc(install_adapter, args=(dict(tensors), dict(peft_config)))[0]
            if not self.llm.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("vLLM kept its prefix cache; outputs would mix adapters")
        self.lora_request = adapter_request()
        return {
            "tensors": len(tensors),
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "seconds": time.perf_counter() - start,
            **phases,
        }

    def engine_adapter_checksums(self) -> dict[str, float]:
        """`vllm_lora.checksum` of what this rank's engine holds of each tensor of the loaded adapter (its
        region, B without the scaling), by PEFT name; compare with `vllm_lora.region_checksums` of the
        trainer's tensors (actor.lora.check_sync). Empty before the first `load_adapter`."""
        with engine_call():
            return self.llm.collective_rpc(installed_adapter_checksums)[0]

    def sleep(self, level: int = 1) -> bool:
        """Release the engine's device memory (level 1: weights to host, KV cache dropped; level 2: both
        dropped). Returns False, doing nothing, where vLLM has no sleep mode (CPU)."""
        if not self.can_sleep:
            return False
        with engine_call():
            self.llm.sleep(level=level)
        return True

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Re-allocate what `sleep` released ("weights", "kv_cache"; None = both). False on CPU."""
        if not self.can_sleep:
            return False
        with engine_call():
            self.llm.wake_up(tags=tags)
            if self.lora_request is not None and (tags is None or "weights" in tags):
                # the adapter slots live with the weights; level 2 left them undefined
                self.llm.collective_rpc(reinstall_adapter)
        return True

    def close(self) -> None:
        """Shut the engine down and destroy vLLM's process groups; the default group keeps working.
        Every rank must call it (the group teardown is collective)."""
        with engine_call():
            self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()
