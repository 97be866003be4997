"""`megarl verify-model --dtype bf16` on one process (gloo, a world of one, TP1): a correct conversion of
the tiny Llama passes the bf16 verdict, and a real defect in megatron's model fails it: one norm weight
dropped (left at 1) or a wrong rotary base."""

from __future__ import annotations

import pytest

from megarl.models import verify

pytestmark = pytest.mark.usefixtures("world_of_one")


@pytest.fixture(scope="module")
def llama(tiny_models) -> str:
    return str(tiny_models["llama"])


def _verify(hf_dir: str) -> dict:
    (row,) = verify.main(["--hf", hf_dir, "--dtype", "bf16"])
    return row


def test_bf16_megatron_error_is_within_factor_of_transformers_own(llama):
    row = _verify(llama)
    assert row["passed"] and row["dtype"] == "bf16" and row["round_trip_exact"]
    for metric, v in row["bf16"].items():
        # Both sides really ran in bf16: each differs from the fp32 reference by far more than fp32 would.
        assert v["hf_bf16_err"] > 0 and v["megatron_bf16_err"] > 0, metric
        assert v["megatron_bf16_err"] <= verify.BF16_FACTOR * v["hf_bf16_err"] + verify.BF16_FLOORS[metric]
    assert row["bf16"]["logits"]["megatron_bf16_err"] > 1e-3  # vs ~1e-6 in fp32


def test_bf16_verdict_fails_a_dropped_norm_weight(llama, monkeypatch):
    load = verify.load_hf_into_chunks

    def load_then_drop_a_norm_weight(chunks, *args):
        loaded = load(chunks, *args)
        norm = chunks[0].decoder.layers[1].input_layernorm.weight
        norm.data.fill_(1.0)
        return loaded

    monkeypatch.setattr(verify, "load_hf_into_chunks", load_then_drop_a_norm_weight)
    row = _verify(llama)
    assert not row["passed"] and not row["bf16"]["logits"]["passed"], row["bf16"]


def test_bf16_verdict_fails_a_wrong_rotary_base(llama, monkeypatch):
    kwargs = verify.ModelArchitecture.gpt_model_kwargs
    monkeypatch.setattr(
        verify.ModelArchitecture,
        "gpt_model_kwargs",
        lambda self, vocab: {**kwargs(self, vocab), "rotary_base": int(self.rope_theta) * 2},
    )
    row = _verify(llama)
    assert row["round_trip_exact"]  # the weights are right: only the numbers can tell
    assert not row["passed"] and not row["bf16"]["logits"]["passed"], row["bf16"]
