"""`RewardController.fit(pairs)`: train the controller's reward model with the Bradley–Terry loss (the
`megarl rm` job, megarl.trainer.reward_model) and make the exported sequence classifier its model.

    rm = RewardController("models/sft", name="learned_rm")     # the backbone: a fresh scalar head on it
    history = rm.fit("pairs.parquet", val_pairs="held_out.parquet", config={"trainer.total_steps": 24})
    GRPOTrainer(actor=..., reward=rm, ...)                     # scores with the trained model
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from megarl.config.load import config_from
from megarl.observe.run_files import read_metrics
from megarl.trainer.reward_model import RewardModelTrainer

if TYPE_CHECKING:
    from megarl.api.controllers import RewardController


def fit_reward_model(
    rc: RewardController,
    pairs: str | Path | list[str | Path],
    config: Any = None,
    val_pairs: str | Path | list[str | Path] | None = None,
    **keys: Any,
) -> list[dict[str, float]]:
    """Train `rc`'s model on `pairs` (parquet/jsonl of prompt/chosen/rejected, as `megarl dpo` reads);
    `config`: the rm job's config (a dict, a MegarlConfig or a YAML path such as
    configs/quickstart_rm.yaml); `keys`: dotted config keys on top. Returns the steps' metrics (step 0:
    validation before training, when val_pairs are given); `rc.model` is then the exported classifier."""
    from megarl.api.controllers import ControllerError

    if rc.model is None:
        raise ControllerError(
            f"reward controller {rc.name!r} has no model to train: RewardController(<checkpoint>).fit(pairs), "
            "a language model (a fresh scalar head) or a sequence classifier to continue"
        )
    if rc.started:
        raise ControllerError(
            f"reward controller {rc.name!r} is scoring for a trainer; close() it before fit()"
        )
    files = [str(Path(p).resolve()) for p in (pairs if isinstance(pairs, list) else [pairs])]
    val = (
        []
        if val_pairs is None
        else [str(Path(p).resolve()) for p in (val_pairs if isinstance(val_pairs, list) else [val_pairs])]
    )
    settings = {
        "algorithm": {"name": "rm"},
        "data": {"train_files": files, "val_files": val},
    }
    from megarl.api.trainers import output_dir_of

    model = rc.model_path(Path(output_dir_of(config, keys, default="outputs/rm")))
    cfg = config_from(config, [settings, {"model": {"path": model}}, keys])
    cfg.trainer.output_dir = str(Path(cfg.trainer.output_dir).resolve())  # the workers run elsewhere
    with RewardModelTrainer(cfg) as trainer:
        rc.model = trainer.fit()
    return read_metrics(Path(cfg.trainer.output_dir) / "metrics.jsonl")
