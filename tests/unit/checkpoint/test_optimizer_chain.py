"""An MoE optimizer checkpoint's common part (param groups, steps) rebuilt for a chain of another length:
megatron's one optimizer at EP1 and its (dense, experts) chain at EP2 (megarl.checkpoint.optimizer_chain;
the tensors and the resumed training: tests/multiproc/test_checkpoint.py)."""

from pathlib import Path

import pytest
import torch

from megarl.checkpoint.format import CheckpointError
from megarl.checkpoint.optimizer_chain import rebuild_common, same_chain

pytestmark = pytest.mark.unit


def group(wd: float, expert: bool, **extra) -> dict:
    return {"wd_mult": wd, "lr_mult": 1.0, "is_decoupled_lr": False, "is_expert_parallel": expert, **extra}


def test_ep1_optimizer_state_fills_the_ep2_chain():
    step = torch.tensor(3.0)
    saved = {
        "state": {"common_step": step},
        "param_groups": [group(1.0, False, lr=0.1), group(0.0, False, lr=0.1)],
    }
    template = {
        0: {
            "state": {"common_step": torch.tensor(0.0)},
            "param_groups": [group(1.0, False), group(0.0, False)],
        },
        1: {"state": {"common_step": torch.tensor(0.0)}, "param_groups": [group(1.0, True)]},
    }
    loaded = {
        0: {"state": {0: "moments"}, "param_groups": [{"params": [0]}, {"params": [1]}]},
        1: {"state": {0: "expert moments"}, "param_groups": [{"params": [0]}]},
        **saved,  # dist_checkpointing.load merges the saved common part in as it is
    }
    assert not same_chain(saved, template)
    state = rebuild_common(loaded, template, saved, Path("ckpt"))
    assert set(state) == {0, 1}
    assert state[1]["param_groups"] == [group(1.0, True, lr=0.1, params=[0])]
    assert state[0]["param_groups"][1] == group(0.0, False, lr=0.1, params=[1])
    assert state[1]["state"] == {0: "expert moments", "common_step": step}


def test_a_group_the_checkpoint_lacks_is_refused():
    saved = {0: {"param_groups": [group(1.0, False)]}, 1: {"param_groups": [group(1.0, True)]}}
    template = {"param_groups": [group(1.0, False), group(0.0, False)]}
    with pytest.raises(CheckpointError, match="wd_mult.: 0.0"):
        rebuild_common({"param_groups": [{"params": [0]}, {"params": [1]}]}, template, saved, Path("ckpt"))
