"""A warm-started tiny policy and its task, built once per session for the trainer tests.

`rl_setup` = a tiny Llama (random weights, offline tokenizer), the digits_reverse task in verl's parquet
schema (warm-start answers: half copy the input), and the model after a short SFT on it (megarl's own
SFT trainer, under Ray) — a policy that answers in the task's format and is right part of the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from megarl.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


@dataclass(frozen=True)
class RLSetup:
    base_model: Path
    sft_model: Path
    data: Path
    root: Path

    def grpo_overrides(self, out: Path, *extra: str) -> list[str]:
        return [
            f"model.path={self.sft_model}",
            f"data.train_files=[{self.data / 'train.parquet'}]",
            f"data.val_files=[{self.data / 'val.parquet'}]",
            f"trainer.output_dir={out}",
            "logging.backends=[console,jsonl]",
            "logging.report=false",  # the GRPO run's report is checked; the others would only cost time
            *extra,
        ]

    def grpo_config(self, out: Path, *extra: str):
        return load_config(CONFIGS / "quickstart_grpo.yaml", self.grpo_overrides(out, *extra))


@pytest.fixture(scope="session")
def rl_setup(tmp_path_factory, ray_cluster) -> RLSetup:
    from megarl.data.tasks import make_task
    from megarl.models.tiny import build_tiny_hf
    from megarl.trainer.sft import SFTTrainer

    root = tmp_path_factory.mktemp("rl")
    base = build_tiny_hf(root / "llama", family="llama")
    make_task("digits_reverse", root / "data", n_train=512, n_val=64, n_sft=2048, sft_noise=0.5)
    cfg = load_config(
        CONFIGS / "quickstart_sft.yaml",
        [
            f"model.path={base}",
            f"data.train_files=[{root / 'data' / 'sft.parquet'}]",
            f"trainer.output_dir={root / 'sft'}",
            "trainer.total_steps=600",
        ],
    )
    sft_model = SFTTrainer(cfg).fit()
    return RLSetup(base_model=base, sft_model=sft_model, data=root / "data", root=root)
