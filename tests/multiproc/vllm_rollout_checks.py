"""Rank code for test_vllm_rollout: VLLMRollout on a tiny Qwen2 against transformers fp32.

argv: MODEL PERTURBED single|tp. `single` (1 rank, tp_g=1): sampling parameters, the returned schema,
log-probs, the colocation guards, a weight push, a sync in mid-generation (partial_rollout_checks) and a
second engine built from the pushed checkpoint —
with the engine's model under torch.compile (rollout.enforce_eager=false, the default), whose graphs
must see the pushed weights.
`tp` (4 ranks, Megatron TP=2 first): generation TP groups [0, 2] and [1, 3], greedy tokens and
log-probs, a weight push under TP, and Megatron's groups after the engine is closed. Rank 0 reports.
"""

from __future__ import annotations

import dataclasses
import time

import psutil
import torch
import torch.distributed as dist

from megarl.config.roles import RolloutSpec, rollout_spec
from megarl.config.schema import MegarlConfig
from megarl.protocol import Batch

N_PROMPTS, PROMPT, RESPONSE = 4, 8, 10
TOKENIZER_VOCAB = 657  # the tiny tokenizer's size; prompts stay inside it and clear of pad/bos/eos


def prompt_batch(seed: int = 0) -> Batch:
    """Left-padded prompts of 3..8 tokens, a tensor and a non-tensor column to be carried through."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.zeros(N_PROMPTS, PROMPT, dtype=torch.long)
    mask = torch.zeros(N_PROMPTS, PROMPT, dtype=torch.long)
    for i, length in enumerate([3, 8, 5, 6][:N_PROMPTS]):
        prompts[i, PROMPT - length :] = torch.randint(3, TOKENIZER_VOCAB, (length,), generator=g)
        mask[i, PROMPT - length :] = 1
    tags = [f"prompt-{i}" for i in range(N_PROMPTS)]
    return Batch({"prompts": prompts, "attention_mask": mask, "row": torch.arange(N_PROMPTS)}, {"tag": tags})


def config(model: str, tp: int, eager: bool = True) -> RolloutSpec:
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = model, "fp32"
    cfg.data.max_prompt_length, cfg.data.max_response_length = PROMPT, RESPONSE
    r = cfg.rollout
    r.tp, r.n, r.temperature, r.seed = tp, 3, 1.0, 7
    r.kv_cache_memory_bytes, r.max_num_seqs, r.enforce_eager = 16 << 20, 16, eager
    return rollout_spec(cfg)


def hf_log_probs(model, out: Batch, temperature: float = 1.0) -> torch.Tensor:
    """transformers fp32 log-probs of every response token of `out` (0 on padding), at `temperature`."""
    result = torch.zeros(out["responses"].shape)
    with torch.no_grad():
        for i in range(len(out)):
            ids = out["input_ids"][i][out["attention_mask"][i].bool()]
            p, r = int(out["attention_mask"][i, :PROMPT].sum()), int(out["response_mask"][i].sum())
            logits = model(input_ids=ids[None]).logits[0].float() / max(temperature, 1e-8)
            rows = torch.log_softmax(logits, dim=-1)[p - 1 : p - 1 + r]
            result[i, :r] = rows.gather(1, ids[p:, None])[:, 0]
    return result


def hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def schema(out: Batch, n: int, max_tokens: int) -> dict:
    """What the returned Batch looks like, as plain numbers for the test to compare."""
    lengths = out["response_mask"].sum(1).long()
    positions = torch.arange(max_tokens)
    return {
        "rows": len(out),
        "shapes": {k: list(out[k].shape) for k in ("prompts", "responses", "input_ids", "attention_mask")},
        "log_prob_dtype": str(out["rollout_log_probs"].dtype),
        "response_mask_is_prefix": bool((out["response_mask"] == (positions < lengths[:, None])).all()),
        "pad_after_response": bool((out["responses"][out["response_mask"] == 0] == 0).all()),
        "zero_log_prob_on_pad": bool((out["rollout_log_probs"][out["response_mask"] == 0] == 0).all()),
        "input_ids_is_concat": bool(
            torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], 1))
        ),
        "attention_mask_tail": bool(
            torch.equal(out["attention_mask"][:, PROMPT:], out["response_mask"].long())
        ),
        "prompts_repeated": bool(
            torch.equal(out["prompts"], prompt_batch()["prompts"].repeat_interleave(n, 0))
        ),
        "lengths": lengths.tolist(),
        "finish_reason": list(out["finish_reason"]),
        "uid": out["uid"].tolist(),
        "row": out["row"].tolist(),
        "tag": list(out["tag"]),
    }


def check_single(model: str, perturbed: str) -> dict:
    from megarl.rollout.vllm import VLLMRollout

    res: dict = {}
    cfg, batch, hf = config(model, tp=1, eager=False), prompt_batch(), hf_model(model)
    torch.manual_seed(123)
    rng_before = torch.get_rng_state()
    t0 = time.time()
    rollout = VLLMRollout(cfg)
    res["engine_start_s"] = time.time() - t0

    t0 = time.time()
    sampled = rollout.generate(batch, cfg.rollout)
    res["first_generate_s"] = time.time() - t0
    res["rng_untouched"] = bool(torch.equal(torch.get_rng_state(), rng_before))
    torch.set_num_threads(2)
    res["threads_settable"] = torch.get_num_threads() == 2
    torch.set_num_threads(1)

    res["schema"] = schema(sampled, cfg.rollout.n, RESPONSE)
    res["sampled_log_prob_diff"] = max_diff(sampled["rollout_log_probs"], hf_log_probs(hf, sampled))
    responses = sampled["responses"].reshape(N_PROMPTS, cfg.rollout.n, RESPONSE)
    res["distinct_samples_per_prompt"] = [len({tuple(r.tolist()) for r in group}) for group in responses]

    warm = dataclasses.replace(cfg.rollout, temperature=0.7, n=2, max_tokens=6)
    t0 = time.time()
    out = rollout.generate(batch, warm)
    res["warm_generate_s"] = time.time() - t0
    res["t07_shape"] = list(out["responses"].shape)
    res["t07_log_prob_diff"] = max_diff(out["rollout_log_probs"], hf_log_probs(hf, out, temperature=0.7))

    greedy_cfg = cfg.rollout.val
    greedy = rollout.generate(batch, greedy_cfg)
    again = rollout.generate(batch, greedy_cfg)
    res["greedy_repeatable"] = bool(torch.equal(greedy["responses"], again["responses"]))
    bare = rollout.generate(batch, greedy_cfg, log_probs=False)
    res["without_log_probs"] = {
        "same_tokens": bool(torch.equal(greedy["responses"], bare["responses"])),
        "columns": sorted(set(greedy.keys()) - set(bare.keys())),
    }
    res["greedy_log_prob_diff"] = max_diff(greedy["rollout_log_probs"], hf_log_probs(hf, greedy))
    res["greedy_tokens"] = greedy["responses"].tolist()

    step = rollout.sampling_step
    first = rollout.generate(batch, cfg.rollout)["responses"]
    rollout.sampling_step = step
    res["same_step_same_samples"] = bool(
        torch.equal(rollout.generate(batch, cfg.rollout)["responses"], first)
    )
    res["next_step_new_samples"] = not torch.equal(rollout.generate(batch, cfg.rollout)["responses"], first)
    rollout.sampling_step, rollout.seed = step, rollout.seed + 1
    res["other_seed_new_samples"] = not torch.equal(rollout.generate(batch, cfg.rollout)["responses"], first)

    # Stop at the first token of prompt 1's greedy response that did not occur before it.
    tokens = greedy["responses"][1].tolist()
    k = next(i for i in range(1, RESPONSE) if tokens[i] not in tokens[:i])
    stopped = rollout.generate(batch, dataclasses.replace(greedy_cfg, stop_token_ids=[tokens[k]]))
    res["stop_token"] = {
        "response": stopped["responses"][1].tolist(),
        "expected": tokens[: k + 1] + [0] * (RESPONSE - k - 1),
        "finish_reason": stopped["finish_reason"][1],
    }

    # Stop at the first decoded piece of prompt 1's greedy response that is new to the text so far.
    decode = rollout.llm.get_tokenizer().decode
    pieces = [decode([t]) for t in tokens]
    k = next(i for i in range(1, RESPONSE) if pieces[i].strip() and pieces[i] not in decode(tokens[:i]))
    stopped = rollout.generate(batch, dataclasses.replace(greedy_cfg, stop=[pieces[k]]))
    res["stop_string"] = {
        "response": stopped["responses"][1].tolist(),
        "expected": tokens[: k + 1] + [0] * (RESPONSE - k - 1),
        "finish_reason": stopped["finish_reason"][1],
    }

    pushed = hf_model(perturbed)
    weights = list(pushed.named_parameters())
    partial = {
        "q_alone": lambda n: n.startswith("model.layers.0.self_attn.q_proj"),
        "weights_without_biases": lambda n: "layers.0.self_attn" in n and n.endswith("_proj.weight"),
    }
    res["partial_layer_push_refused"] = {}
    for label, picked in partial.items():
        try:
            rollout.load_weights([(n, w) for n, w in weights if picked(n)])
            res["partial_layer_push_refused"][label] = False
        except ValueError:
            res["partial_layer_push_refused"][label] = True
    t0 = time.time()
    res["push_loader"] = rollout.load_weights(weights)
    res["push_s"] = time.time() - t0
    after = rollout.generate(batch, greedy_cfg)
    res["push_changed_tokens"] = not torch.equal(after["responses"], greedy["responses"])
    res["pushed_log_prob_diff"] = max_diff(after["rollout_log_probs"], hf_log_probs(pushed, after))
    res["pushed_greedy_tokens"] = after["responses"].tolist()

    # Back to the original weights, one bucket per decoder layer (plus one for the rest), as a
    # streaming reshard pushes them: the original greedy outputs must come back exactly.
    buckets: dict[str, list] = {}
    for name, w in hf.named_parameters():
        layer = name.split(".")[2] if ".layers." in name else "rest"
        buckets.setdefault(layer, []).append((name, w))
    loaders = {rollout.load_weights(bucket) for bucket in buckets.values()}
    restored = rollout.generate(batch, greedy_cfg)
    res["bucketed_restore"] = {
        "buckets": len(buckets),
        "loaders": sorted(loaders),
        "same_tokens": bool(torch.equal(restored["responses"], greedy["responses"])),
        "log_prob_diff": max_diff(restored["rollout_log_probs"], greedy["rollout_log_probs"]),
    }
    # On this engine, with the original weights again: test_partial_rollout's checks.
    from tests.multiproc.partial_rollout_checks import check_partial

    res["partial"] = check_partial(rollout, batch, model, perturbed)
    rollout.load_weights(weights)

    rollout.close()
    x = torch.ones(1)
    dist.all_reduce(x)
    res["default_group_after_close"] = x.item()

    fresh_cfg = config(perturbed, tp=1, eager=False)
    t0 = time.time()
    fresh = VLLMRollout(fresh_cfg)
    res["second_engine_start_s"] = time.time() - t0
    rebuilt = fresh.generate(batch, greedy_cfg)
    res["rebuilt_equals_pushed_tokens"] = bool(torch.equal(rebuilt["responses"], after["responses"]))
    res["rebuilt_vs_pushed_log_prob_diff"] = max_diff(
        rebuilt["rollout_log_probs"], after["rollout_log_probs"]
    )
    fresh.close()
    return res


def check_tp(model: str, perturbed: str) -> dict:
    from megatron.core import parallel_state as mpu

    from megarl.distributed.layout import ParallelLayout
    from megarl.rollout.vllm import VLLMRollout

    res: dict = {"seconds_since_start": {"imports": since_start()}}
    ParallelLayout(world_size=dist.get_world_size(), tp=2).initialize()
    res["seconds_since_start"]["megatron_layout"] = since_start()
    cfg, batch = config(model, tp=2), prompt_batch()
    groups = [[0, 2], [1, 3]]
    t0 = time.time()
    rollout = VLLMRollout(cfg, tp_groups=groups)
    res["engine_start_s"] = time.time() - t0
    res["seconds_since_start"]["engine"] = since_start()
    res["engine_tp_ranks"] = gather(rollout.tp_ranks)

    greedy = rollout.generate(batch, cfg.rollout.val)
    sampled = rollout.generate(batch, cfg.rollout)
    res["greedy_tokens"] = greedy["responses"].tolist()
    res["greedy_tokens_all_ranks_equal"] = all(
        t == res["greedy_tokens"] for t in gather(res["greedy_tokens"])
    )
    res["sampled_tokens"] = gather(sampled["responses"].tolist())
    # Every rank pushes full tensors; only each replica's first rank (the one collected) is compared.
    collected = rollout.tp_ranks[0] == dist.get_rank()
    if collected:
        hf = hf_model(model)
        diffs = [max_diff(o["rollout_log_probs"], hf_log_probs(hf, o)) for o in (greedy, sampled)]
    res["log_prob_diff_per_replica"] = [d for d in gather(max(diffs) if collected else None) if d is not None]
    res["seconds_since_start"]["generate_and_reference"] = since_start()

    from safetensors.torch import load_file

    res["push_loader"] = rollout.load_weights(load_file(f"{perturbed}/model.safetensors").items())
    after = rollout.generate(batch, cfg.rollout.val)
    res["pushed_greedy_tokens"] = after["responses"].tolist()
    diff = (
        max_diff(after["rollout_log_probs"], hf_log_probs(hf_model(perturbed), after)) if collected else None
    )
    res["pushed_log_prob_diff_per_replica"] = [d for d in gather(diff) if d is not None]

    rollout.close()
    sums = {}
    for name, group in (
        ("world", None),
        ("megatron_tp", mpu.get_tensor_model_parallel_group()),
        ("megatron_dp", mpu.get_data_parallel_group()),
    ):
        x = torch.ones(1)
        dist.all_reduce(x, group=group)
        sums[name] = x.item()
    res["all_reduce_after_close"] = sums
    res["seconds_since_start"]["done"] = since_start()
    return res


def since_start() -> float:
    """Seconds since this process started (imports included)."""
    return time.time() - psutil.Process().create_time()


def gather(value):
    """`value` from every rank, in rank order."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def main(argv: list[str]) -> dict:
    model, perturbed, part = argv
    return check_single(model, perturbed) if part == "single" else check_tp(model, perturbed)
