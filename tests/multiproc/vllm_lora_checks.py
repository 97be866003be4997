"""Rank code for test_vllm_lora: a VLLMRollout with LoRA (one rank, tiny Llama fp32) against `peft` on the
transformers model. argv: MODEL. Adapters made by peft (init_lora_weights=False, so B is not zero) are
loaded from memory by their saved names; greedy tokens of the single-turn, partial-rollout and agentic
(EngineDriver) paths are compared with peft's, and the engine's checksums with the tensors'.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from megarl.config.schema import SamplingConfig
from tests.multiproc.vllm_rollout_checks import RESPONSE, config, prompt_batch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 8, 16
PEFT_CONFIG = {"r": RANK, "lora_alpha": ALPHA, "target_modules": TARGETS}


def _prompts() -> list[list[int]]:
    batch = prompt_batch()
    return [row[mask.bool()].tolist() for row, mask in zip(batch["prompts"], batch["attention_mask"])]


def _peft_model(model: str):
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    torch.manual_seed(0)
    lora = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, init_lora_weights=False)
    return peft.get_peft_model(base, lora).eval()


def _saved_tensors(pm) -> dict[str, torch.Tensor]:
    """The adapter under the names PEFT saves it by (adapter_model.safetensors)."""
    import peft

    return {name: t.detach().clone() for name, t in peft.get_peft_model_state_dict(pm).items()}


def _hf_greedy(pm, prompts: list[list[int]]) -> list[list[int]]:
    with torch.no_grad():
        return [
            pm.generate(torch.tensor([p]), max_new_tokens=RESPONSE, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]


def _tokens(out) -> list[list[int]]:
    return [r[m.bool()].tolist() for r, m in zip(out["responses"], out["response_mask"])]


def _driver_greedy(rollout, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy responses through the agentic engine driver (the multi-turn path), one turn each."""
    import threading

    from vllm import SamplingParams

    from megarl.agentic.engine_driver import EngineDriver
    from megarl.rollout.colocate import engine_call

    driver = EngineDriver(rollout.llm, engine_call, lora_request=rollout.lora_request)
    futures = [
        driver.submit(str(i), p, SamplingParams(n=1, temperature=0.0, max_tokens=RESPONSE))
        for i, p in enumerate(prompts)
    ]
    done = threading.Event()
    done.set()
    driver.serve(done)
    return [f.result().ids for f in futures]


def main(argv: list[str]) -> dict:
    from megarl.rollout.vllm import VLLMRollout
    from megarl.rollout.vllm_lora import region_checksums

    (model,) = argv
    prompts, batch = _prompts(), prompt_batch()
    pm = _peft_model(model)
    first = _saved_tensors(pm)
    peft_first = _hf_greedy(pm, prompts)
    with pm.disable_adapter():
        base = _hf_greedy(pm, prompts)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    second = _saved_tensors(pm)
    peft_second = _hf_greedy(pm, prompts)

    # the stand-in for megarl.config.schema_lora.LoraConfig (config helper's branch): what the engine reads
    lora = SimpleNamespace(rank=RANK, alpha=ALPHA, target_modules=["all-linear"], exclude_modules=[])
    spec = dataclasses.replace(config(model, tp=1), lora=lora)
    rollout = VLLMRollout(spec)
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=RESPONSE)
    kv_heads = rollout.llm.llm_engine.model_config.hf_config.num_key_value_heads
    res: dict = {"hf": {"base": base, "first": peft_first, "second": peft_second}}
    res["engine_kwargs"] = {k: v for k, v in rollout.engine_kwargs.items() if "lora" in k}
    res["no_adapter"] = _tokens(rollout.generate(batch, greedy, log_probs=False))

    untouched = {name: t.clone() for name, t in first.items()}
    res["load_first"] = rollout.load_adapter(first, PEFT_CONFIG)
    res["caller_tensors_unchanged"] = all(torch.equal(first[n], untouched[n]) for n in first)
    res["first"] = {
        "single": _tokens(rollout.generate(batch, greedy, log_probs=False)),
        "partial": _tokens(rollout.generate(batch, greedy, log_probs=False, between_steps=lambda: None)),
        "driver": _driver_greedy(rollout, prompts),
    }
    engine_sums, trainer_sums = rollout.engine_adapter_checksums(), region_checksums(first, 1, 0, kv_heads)
    res["first_checksums"] = {
        "names_equal": sorted(engine_sums) == sorted(trainer_sums),
        "n": len(engine_sums),
    }
    res["first_checksums"]["max_diff"] = max(abs(engine_sums[n] - trainer_sums[n]) for n in trainer_sums)

    res["load_second"] = rollout.load_adapter(second, PEFT_CONFIG)
    res["second"] = {
        "single": _tokens(rollout.generate(batch, greedy, log_probs=False)),
        "driver": _driver_greedy(rollout, prompts),
    }
    engine_sums, trainer_sums = rollout.engine_adapter_checksums(), region_checksums(second, 1, 0, kv_heads)
    res["second_checksums_max_diff"] = max(abs(engine_sums[n] - trainer_sums[n]) for n in trainer_sums)
    res["checksums_see_the_change"] = any(
        abs(a - b) > 1e-3
        for a, b in zip(region_checksums(first, 1, 0, kv_heads).values(), trainer_sums.values())
    )

    # a base-weight push into a LoRA engine keeps the adapter (the fast CPU path sees through LoRA layers)
    hf_weights = pm.get_base_model().state_dict()
    base_weights = {
        n.replace(".base_layer", ""): t
        for n, t in hf_weights.items()
        if "lora_" not in n and "rotary" not in n
    }
    res["base_push_loader"] = rollout.load_weights(base_weights.items())
    res["after_base_push"] = _tokens(rollout.generate(batch, greedy, log_probs=False))

    bogus = {"base_model.model.model.layers.0.self_attn.qk_proj.lora_A.weight": torch.zeros(RANK, 64)}
    try:
        rollout.load_adapter(bogus, PEFT_CONFIG)
        res["unknown_module_error"] = None
    except ValueError as e:
        res["unknown_module_error"] = str(e)
    rollout.close()
    return res
