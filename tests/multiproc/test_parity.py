"""Megatron vs transformers (fp32, CPU): logits, loss and every gradient, at every layout, one launch."""

import re

import pytest

from tests.conftest import FAMILIES

pytestmark = pytest.mark.multiproc

LAYOUTS = ["tp1pp1", "tp2pp1", "tp1pp2", "tp2pp2", "tp1pp2vpp2", "tp2pp1sp"]


@pytest.fixture(scope="module")
def parity(tiny_models, torchrun):
    args = [a for path in tiny_models.values() for a in ("--hf", path)] + ["--layouts", ",".join(LAYOUTS)]
    return torchrun("megarl.models.verify", args, nproc=4).results


def rows_of(parity, family):
    rows = [r for r in parity if r["family"] == family]
    assert len(rows) == len(LAYOUTS), f"{family}: {len(rows)} results for {len(LAYOUTS)} layouts"
    return rows


def test_every_layout_of_every_family_was_checked(parity):
    checked = {(r["family"], re.sub(r"xdp\d+", "", r["layout"]).replace("x", "")) for r in parity}
    assert checked == {(family, layout) for family in FAMILIES for layout in LAYOUTS}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hf_fp32_within_5e5(parity, family):
    for r in rows_of(parity, family):
        assert r["hf_logits_abs_max"] > 1.0, "logits too small for the comparison to mean anything"
        assert r["max_abs_logit_diff"] <= 5e-5, r


@pytest.mark.parametrize("family", FAMILIES)
def test_loss_and_gradients_match_hf_at_every_layout(parity, family):
    for r in rows_of(parity, family):
        assert r["loss_abs_diff"] <= 5e-6, r
        assert r["max_abs_grad_diff"] <= 5e-5, r
        assert r["grad_norm_rel_diff"] <= 1e-5, r


@pytest.mark.parametrize("family", FAMILIES)
def test_loss_and_grad_norm_identical_across_layouts(parity, family):
    rows = rows_of(parity, family)
    losses = [r["loss"] for r in rows]
    norms = [r["grad_norm"] for r in rows]
    assert max(losses) - min(losses) <= 5e-6
    assert (max(norms) - min(norms)) / norms[0] <= 1e-5


SCALAR_LAYOUTS = ["tp1pp1", "tp2pp2", "tp1pp2vpp2", "tp2pp1sp"]


@pytest.fixture(scope="module")
def scalar_parity(tiny_reward_models, torchrun):
    args = [a for path in tiny_reward_models.values() for a in ("--hf", path)]
    return torchrun("megarl.models.verify", [*args, "--layouts", ",".join(SCALAR_LAYOUTS)], nproc=4).results


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_scalar_head_scores_and_gradients_match_hf(scalar_parity, family):
    rows = [r for r in scalar_parity if r["family"] == family]
    assert len(rows) == len(SCALAR_LAYOUTS)
    for r in rows:
        assert r["head"] == "scalar" and r["hf_logits_abs_max"] > 1.0
        assert r["max_abs_logit_diff"] <= 5e-5, r
        assert r["loss_abs_diff"] <= 5e-6, r
        assert r["max_abs_grad_diff"] <= 5e-5, r
        assert r["grad_norm_rel_diff"] <= 1e-5, r
