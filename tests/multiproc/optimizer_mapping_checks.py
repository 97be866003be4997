"""Rank code for test_optimizer_mapping: megatron's optimizer built from each OptimizerConfig.name on one
rank (gloo), stepped on the same gradients.

A rank program (megarl.distributed.rank_program) on 1 rank, argv: DIR (for a checkpoint). It reports one dict of maximum
parameter differences. The gradients are written straight into DDP's grad buffer (`main_grad`; with one
rank there is nothing to reduce), so every run sees the same ones. The references are torch.optim's AdamW,
Adam and SGD on a copy of the parameters, grouped as megatron groups them (no weight decay on biases and
1-D weights).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from megarl.api.optimizers import optimizer_config
from megarl.checkpoint.role import load_train_state, save_train_state
from megarl.config.schema import OptimizerConfig
from megarl.distributed.layout import ParallelLayout
from megarl.models.build import build_model_chunks
from megarl.models.ddp import wrap_ddp
from megarl.models.from_hf import ModelArchitecture
from megarl.models.optimizer import build_optimizer

HF_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
    "vocab_size": 100,
}
ARCH = ModelArchitecture.from_hf_config(HF_CONFIG)
LAYOUT = ParallelLayout(world_size=1)
HYPER = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
STEPS = 3  # momentum and Adam's bias correction act from the second step on


def fresh_chunks(weights: dict[str, torch.Tensor], dist_opt: bool) -> list[torch.nn.Module]:
    chunk = build_model_chunks(ARCH, LAYOUT)[0]
    with torch.no_grad():
        for name, p in chunk.named_parameters():
            p.copy_(weights[name])
    return wrap_ddp([chunk], use_distributed_optimizer=dist_opt)


def gradients(weights: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """STEPS sets of gradients, of varied scale per parameter."""
    gen = torch.Generator().manual_seed(3)
    return [
        {
            name: torch.randn(w.shape, generator=gen) * (1 + i % 5)
            for i, (name, w) in enumerate(weights.items())
        }
        for _ in range(STEPS)
    ]


def megatron_run(weights, grads, cfg: OptimizerConfig, steps: int = STEPS) -> dict[str, torch.Tensor]:
    chunks = fresh_chunks(weights, cfg.use_distributed_optimizer)
    opt = build_optimizer(chunks, cfg, total_steps=steps)
    step(chunks, opt, grads[:steps])
    return params_of(chunks)


def step(chunks, opt, grads: list[dict[str, torch.Tensor]]) -> None:
    for step_grads in grads:
        opt.zero_grad()
        for name, p in chunks[0].module.named_parameters():
            p.main_grad.copy_(step_grads[name])
        assert opt.step()["update_successful"]


def params_of(chunks) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in chunks[0].module.named_parameters()}


def sgd_resume_diff(weights, grads, directory: Path) -> float:
    """SGD's momentum survives a checkpoint: steps 1-2, save, step 3 == steps 1-2, load, step 3."""
    hf_dir = directory / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps(HF_CONFIG))
    cfg = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, use_distributed_optimizer=False)
    chunks = fresh_chunks(weights, dist_opt=False)
    opt = build_optimizer(chunks, cfg, total_steps=STEPS)
    step(chunks, opt, grads[:2])
    meta = {"dtype": "fp32", "padded_vocab_size": chunks[0].module.vocab_size, "source": str(hf_dir)}
    save_train_state(chunks, opt, directory / "ckpt", meta, hf_dir)
    step(chunks, opt, grads[2:])
    resumed = fresh_chunks(weights, dist_opt=False)
    resumed_opt = build_optimizer(resumed, cfg, total_steps=STEPS)
    assert load_train_state(resumed, resumed_opt, directory / "ckpt")["optimizer"] == "loaded"
    step(resumed, resumed_opt, grads[2:])
    want, got = params_of(chunks), params_of(resumed)
    return max((got[n] - want[n]).abs().max().item() for n in want)


def torch_run(weights, grads, make_optimizer) -> dict[str, torch.Tensor]:
    params = {name: torch.nn.Parameter(w.clone()) for name, w in weights.items()}
    no_decay = [p for name, p in params.items() if p.ndim == 1 or name.endswith(".bias")]
    decay = [p for name, p in params.items() if not (p.ndim == 1 or name.endswith(".bias"))]
    opt = make_optimizer([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}])
    for step_grads in grads:
        for name, p in params.items():
            p.grad = step_grads[name].clone()
        opt.step()
    return {name: p.detach() for name, p in params.items()}


def allclose_ratio(got: dict, want: dict) -> float:
    """max |got − want| / (1e-6·|want| + 1e-7) over all elements: ≤ 1 is allclose(rtol=1e-6, atol=1e-7),
    fp32 rounding of the parameter (torch's fused Adam kernel against its single-tensor one)."""
    return max(((got[n] - want[n]).abs() / (1e-6 * want[n].abs() + 1e-7)).max().item() for n in want)


def main(spec: list[str]) -> dict:
    LAYOUT.initialize(seed=7)
    weights = {name: p.detach().clone() for name, p in build_model_chunks(ARCH, LAYOUT)[0].named_parameters()}
    grads = gradients(weights)
    dummy = [torch.nn.Parameter(torch.zeros(1))]  # only the torch optimizer's hyper-parameters are read

    # a torch AdamW instance vs the equivalent dict: step 1 with the default clip_grad, dist opt on and off
    from_torch = optimizer_config(torch.optim.AdamW(dummy, **HYPER))
    from_dict = optimizer_config({**HYPER, "betas": list(HYPER["betas"])})
    identical = {}
    for dist_opt in (False, True):
        a = megatron_run(weights, grads, replace(from_torch, use_distributed_optimizer=dist_opt), 1)
        b = megatron_run(weights, grads, replace(from_dict, use_distributed_optimizer=dist_opt), 1)
        identical[str(dist_opt)] = max((a[n] - b[n]).abs().max().item() for n in a)
    moved = max((a[n] - weights[n]).abs().max().item() for n in a)

    # each name against torch's own optimizer on the same parameters and gradients, no clipping
    references = {
        "adamw": lambda groups: torch.optim.AdamW(groups, **HYPER, foreach=False),
        "adam": lambda groups: torch.optim.Adam(groups, **HYPER, foreach=False),
        "sgd": lambda groups: torch.optim.SGD(groups, lr=0.05, momentum=0.9, weight_decay=0.1, foreach=False),
    }
    vs_torch = {}
    for name, make in references.items():
        cfg = optimizer_config(make(dummy), base=OptimizerConfig(clip_grad=0.0))
        want = torch_run(weights, grads, make)
        for dist_opt in (False, True) if name != "sgd" else (False,):  # megatron shards Adam only
            got = megatron_run(weights, grads, replace(cfg, use_distributed_optimizer=dist_opt))
            vs_torch[f"{name}/dist_opt={dist_opt}"] = allclose_ratio(got, want)
    # the mapping is not vacuous: plain Adam and SGD differ from AdamW on the same gradients
    adamw = torch_run(weights, grads, references["adamw"])
    distinct = {
        name: allclose_ratio(torch_run(weights, grads, references[name]), adamw) for name in ("adam", "sgd")
    }
    try:
        megatron_run(weights, grads, OptimizerConfig(name="sgd", use_distributed_optimizer=True), 1)
        sgd_dist_opt_error = ""
    except ValueError as e:
        sgd_dist_opt_error = str(e)
    return {
        "sgd_resume_max_diff": sgd_resume_diff(weights, grads, Path(spec[0])),
        "adamw_instance_vs_dict_max_diff": identical,
        "step1_max_change": moved,
        "vs_torch_allclose_ratio": vs_torch,
        "adam_and_sgd_vs_adamw_allclose_ratio": distinct,
        "sgd_dist_opt_error": sgd_dist_opt_error,
    }
