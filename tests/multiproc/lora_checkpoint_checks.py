"""Rank code for test_lora_checkpoint: adapter-only role checkpoints of a LoRA model and its exports.

A rank program (2 ranks, in the shared 2-rank launch), argv: HF DIR.
  tp2      adapters on the tiny Llama, 2 AdamW steps, save (adapters + optimizer), 2 more steps; the live
           PEFT and merged exports at the save; a fresh model (other adapter seed) loads the checkpoint and
           repeats the 2 steps: losses, adapters and Adam moments bitwise the uninterrupted run's
  tp1pp2   the checkpoint loads at another layout: adapters bitwise, logits and the next 2 losses equal
  refused  a LoRA checkpoint into a model without adapters or with another rank, a full checkpoint into
           a LoRA model: CheckpointError, nothing changed
Writes DIR/saved.pt (the eval tokens, the logits and full adapters at the save) for the test's PEFT and
transformers comparisons.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from megarl.checkpoint.lora_export import export_lora
from megarl.checkpoint.role import load_train_state, save_train_state
from megarl.config.schema import OptimizerConfig
from megarl.distributed.layout import ParallelLayout
from megarl.models.build import build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.loader import load_hf_into_chunks
from megarl.models.ddp import wrap_ddp
from megarl.models.forward import gather_logits, run_microbatches, vocab_parallel_log_probs
from megarl.models.from_hf import ModelArchitecture
from megarl.models.lora.apply import adapters_disabled, apply_lora, lora_params
from megarl.models.lora.peft_io import gather_full_adapter
from megarl.models.optimizer import build_optimizer
from tests.multiproc.checkpoint_checks import error_of

LORA = SimpleNamespace(
    rank=8, alpha=16.0, dropout=0.0, target_modules="all-linear", exclude_modules=["o_proj"], init_A="kaiming"
)
OPTIMIZER = OptimizerConfig(lr=1e-2, clip_grad=1.0)
BATCH, SEQ, STEPS = 2, 16, 2


class Model:
    """A tiny Llama at `tp`×`pp` on the world, with adapters (seeded `seed`) unless lora is None."""

    def __init__(self, hf: str, tp: int, pp: int, lora=LORA, seed: int = 1, optimizer: bool = True):
        from megatron.core import parallel_state as ps

        ParallelLayout.destroy()
        ParallelLayout(world_size=dist.get_world_size(), tp=tp, pp=pp).initialize()
        self.hf, self.lora, self.arch = hf, lora, ModelArchitecture.from_pretrained(hf)
        torch.manual_seed(0)
        chunks = build_model_chunks(self.arch, ParallelLayout.active())
        load_hf_into_chunks(
            chunks, self.arch, HFCheckpointReader(hf), ps.get_tensor_model_parallel_rank(), tp
        )
        if lora is not None:
            apply_lora(chunks, self.arch, lora, seed=seed)
        self.chunks = wrap_ddp(chunks, use_distributed_optimizer=True)
        self.opt = build_optimizer(self.chunks, OPTIMIZER, total_steps=8) if optimizer else None

    def meta(self) -> dict:
        return {"dtype": "fp32", "padded_vocab_size": self.chunks[0].module.vocab_size, "source": self.hf}

    def save(self, ckpt: Path) -> dict:
        return save_train_state(
            self.chunks, self.opt, ckpt, self.meta(), self.hf, arch=self.arch, lora=self.lora
        )

    def load(self, ckpt: Path) -> dict:
        return load_train_state(
            self.chunks, self.opt, ckpt, arch=self.arch, model_path=self.hf, lora=self.lora
        )

    def step(self, tokens: torch.Tensor) -> float:
        """One optimizer step on `tokens` (token mean over the batch); the loss."""
        from megatron.core import parallel_state as ps

        mbs = [{"input_ids": tokens[i : i + 1, :-1], "labels": tokens[i : i + 1, 1:]} for i in range(BATCH)]

        def token_mean(mb, out):
            loss = -vocab_parallel_log_probs(out, mb["labels"], self.arch.vocab_size).mean() / BATCH
            return loss, {"loss": loss.detach().clone()}

        self.opt.zero_grad()
        outs = run_microbatches(self.chunks, mbs, token_mean, forward_only=False)
        assert self.opt.step()["update_successful"]
        last = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
        total = torch.tensor(sum(o["loss"].item() for o in outs) if last else 0.0, dtype=torch.float64)
        dist.all_reduce(total)
        return total.item()

    def logits(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """Full-vocabulary logits on the last pipeline stage (None elsewhere)."""
        from megatron.core import parallel_state as ps

        outs = run_microbatches(
            self.chunks,
            [{"input_ids": tokens[i : i + 1, :-1]} for i in range(len(tokens))],
            lambda mb, out: (out.sum() * 0, {"logits": gather_logits(out, self.arch.vocab_size).detach()}),
            forward_only=True,
        )
        return torch.cat([o["logits"] for o in outs]) if ps.is_pipeline_last_stage() else None

    def adapter(self) -> dict[str, torch.Tensor]:
        return gather_full_adapter(self.chunks, self.arch, self.lora)

    def moments(self) -> list[torch.Tensor]:
        inner = [o.optimizer for o in self.opt.optimizer.chained_optimizers]
        return [s[k].clone() for opt in inner for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")]


def max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def same_layout(hf: str, root: Path, data: list[torch.Tensor], evals: torch.Tensor) -> dict:
    a = Model(hf, tp=2, pp=1)
    for tokens in data[:STEPS]:
        a.step(tokens)
    saved = a.save(root / "ckpt")
    adapter, logits = a.adapter(), a.logits(evals)
    export_lora(a.chunks, a.arch, a.lora, hf, root / "peft_live", merged_dir=root / "merged_live")
    if dist.get_rank() == 0:
        torch.save({"tokens": evals, "logits": logits, "adapter": adapter}, root / "saved.pt")
    dist.barrier()
    losses_a = [a.step(t) for t in data[STEPS:]]
    after_a, moments_a = a.adapter(), a.moments()

    b = Model(hf, tp=2, pp=1, seed=5)  # other initial adapters: the load must replace them
    report = b.load(root / "ckpt")
    loaded = same(b.adapter(), adapter)
    losses_b = [b.step(t) for t in data[STEPS:]]
    moments_b = b.moments()
    return {
        "saved": saved,
        "report": {k: v for k, v in report.items() if k not in ("seconds", "extra_state")},
        "adapters_loaded_bitwise": loaded,
        "losses_a": losses_a,
        "losses_b": losses_b,
        "adapters_after_equal": same(b.adapter(), after_a),
        "moments_equal": len(moments_a) == len(moments_b)
        and all(torch.equal(x, y) for x, y in zip(moments_a, moments_b)),
        "adapter_bytes": sum(t.numel() * t.element_size() for t in adapter.values()),
    }


def other_layout(hf: str, root: Path, data: list[torch.Tensor], evals: torch.Tensor, losses: list) -> dict:
    """TP2's checkpoint at TP1×PP2: the adapters, the logits and the next steps (Adam state resharded)."""
    saved = torch.load(root / "saved.pt")
    c = Model(hf, tp=1, pp=2, seed=7)
    report = c.load(root / "ckpt")
    logits = c.logits(evals)
    with adapters_disabled(c.chunks):
        base = c.logits(evals)
    diff = (logits - saved["logits"]).abs().max().item() if logits is not None else 0.0
    effect = (logits - base).abs().max().item() if logits is not None else 0.0
    return {
        "report": {k: v for k, v in report.items() if k not in ("seconds", "extra_state")},
        "adapters_loaded_bitwise": same(c.adapter(), saved["adapter"]),
        "max_abs_logit_diff": max_over_ranks(diff),
        "adapter_effect": max_over_ranks(effect),
        "losses": [c.step(t) for t in data[STEPS:]],
        "losses_uninterrupted": losses,
    }


def refused(hf: str, root: Path) -> dict:
    plain = Model(hf, tp=1, pp=2, lora=None, optimizer=False)
    errors = {"lora_into_plain": error_of(lambda: plain.load(root / "ckpt"))}
    plain.save(root / "full")
    full_bytes = dir_bytes(root / "full" / "model")
    other = Model(hf, tp=1, pp=2, lora=SimpleNamespace(**{**vars(LORA), "rank": 4}))
    errors["other_rank"] = error_of(lambda: other.load(root / "ckpt"))
    lora = Model(hf, tp=1, pp=2, seed=3)
    before = {k: v.detach().clone() for k, v in lora_params(lora.chunks).items()}
    errors["full_into_lora"] = error_of(lambda: lora.load(root / "full"))
    unchanged = all(torch.equal(before[k], v) for k, v in lora_params(lora.chunks).items())
    return {
        "errors": errors,
        "unchanged": bool(max_over_ranks(float(not unchanged)) == 0),
        "full_bytes": full_bytes,
    }


def main(argv: list[str]) -> dict:
    hf, root = argv[0], Path(argv[1])
    vocab = ModelArchitecture.from_pretrained(hf).vocab_size
    gen = torch.Generator().manual_seed(4)
    data = [torch.randint(0, vocab, (BATCH, SEQ + 1), generator=gen) for _ in range(2 * STEPS)]
    evals = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=gen)
    tp2 = same_layout(hf, root, data, evals)
    result = {
        "dir": str(root),
        "tp2": tp2,
        "tp1pp2": other_layout(hf, root, data, evals, tp2["losses_a"]),
        "refused": refused(hf, root),
        "model_bytes": dir_bytes(root / "ckpt" / "model"),
        "base_bytes": sum(p.stat().st_size for p in Path(hf).glob("*.safetensors")),
    }
    ParallelLayout.destroy()
    return result
