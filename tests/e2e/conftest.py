"""A warm-started tiny policy and its task, built once per session for the trainer tests.

`rl_setup` = a tiny Llama (random weights, offline tokenizer), the digits_reverse task in verl's parquet
schema (warm-start answers: half copy the input), and the model after a short SFT on it (megarl's own
SFT trainer, under Ray, on a parquet in verl's GSM8K schema read with verl's SFT keys) — a policy that
answers in the task's format and is right part of the time.
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
            "trainer.save_every=-1",  # the runs that check checkpoints turn saving back on
            *extra,
        ]

    def grpo_config(self, out: Path, *extra: str):
        return load_config(CONFIGS / "quickstart_grpo.yaml", self.grpo_overrides(out, *extra))


def as_verl_gsm8k_sft(sft: Path, out: Path) -> Path:
    """The task's SFT pairs rewritten in the schema of verl's examples/data_preprocess/gsm8k.py output
    (the question and the answer only under extra_info), so the session's SFT reads them with verl's keys."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": row["data_source"],
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "ability": "digits",
            "reward_model": {"style": "rule", "ground_truth": row["response"]},
            "extra_info": {
                "split": "train",
                "index": i,
                "answer": row["response"],
                "question": row["prompt"],
            },
        }
        for i, row in enumerate(pq.read_table(sft).to_pylist())
    ]
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


@pytest.fixture(scope="session")
def rl_setup(tmp_path_factory, ray_cluster) -> RLSetup:
    from megarl.data.tasks import make_task
    from megarl.models.tiny import build_tiny_hf
    from megarl.trainer.sft import SFTTrainer

    root = tmp_path_factory.mktemp("rl")
    base = build_tiny_hf(root / "llama", family="llama")
    files = make_task("digits_reverse", root / "data", n_train=512, n_val=64, n_sft=2048, sft_noise=0.5)
    cfg = load_config(
        CONFIGS / "quickstart_sft.yaml",
        [
            f"model.path={base}",
            f"data.train_files=[{as_verl_gsm8k_sft(files.sft, root / 'data' / 'sft_verl.parquet')}]",
            # verl's examples/sft/gsm8k keys, as its scripts pass them
            "data.prompt_key=extra_info",
            "data.prompt_dict_keys=[question]",
            "data.response_key=extra_info",
            "data.response_dict_keys=[answer]",
            f"trainer.output_dir={root / 'sft'}",
            "trainer.total_steps=600",
            # the tests read the HF export alone: no checkpoint of the last step (≈ 4 s), no report (≈ 3 s)
            "trainer.save_every=-1",
            "logging.report=false",
        ],
    )
    with SFTTrainer(cfg) as trainer:
        sft_model = trainer.fit()
    return RLSetup(base_model=base, sft_model=sft_model, data=root / "data", root=root)


# the GRPO run also logs to TensorBoard and wandb (offline), profiles step 2 on both ranks, saves at
# step 6 and 12, exports the final actor to HF and dumps its validation responses
OBSERVED = (
    "logging.backends=[console,tensorboard,wandb]",
    "trainer.profile_steps=[2]",
    "trainer.profile_ranks=[0,1]",
    "logging.report=true",
    "trainer.save_every=6",
    "trainer.save_hf=true",
)


@dataclass(frozen=True)
class GRPORun:
    cfg: object
    history: list
    responses: list
    out: Path


@pytest.fixture(scope="session")
def grpo_run(rl_setup, tmp_path_factory) -> GRPORun:
    """12 GRPO steps of 32 prompts × 8 samples under Ray, validated before and after."""
    from tests.helpers.rl_runs import GRPO, run

    out = tmp_path_factory.mktemp("grpo")
    cfg = rl_setup.grpo_config(
        out,
        *GRPO,
        "trainer.total_steps=12",
        "trainer.eval_every=12",
        f"trainer.validation_data_dir={out / 'validation'}",
        *OBSERVED,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        history, responses = run(cfg)
    return GRPORun(cfg, history, responses, out)
