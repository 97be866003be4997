"""The actor's role checkpoint (weights, optimizer, LR schedule, RNG, counters) through the worker: a
4-rank launch saves at TP2×PP2 and checks the same-layout resume and the bad-checkpoint errors, a
2-rank launch loads the same checkpoints at TP1×PP2 and TP1×PP1 (DP2)."""

import pytest

pytestmark = pytest.mark.multiproc


@pytest.fixture(scope="module")
def spec(tiny_models, tmp_path_factory):
    from megarl.models.tiny import build_tiny_hf

    other = build_tiny_hf(tmp_path_factory.mktemp("other") / "llama", hidden_size=64, num_hidden_layers=2)
    return [tiny_models["llama"], other, tmp_path_factory.mktemp("ckpt")]


@pytest.fixture(scope="module")
def saved(torchrun, spec):
    results = torchrun("tests.multiproc.checkpoint_checks:save_side", spec, nproc=4, timeout=400).results
    return {r["check"]: r for r in results}


@pytest.fixture(scope="module")
def resharded(torchrun, spec, saved):
    results = torchrun("tests.multiproc.checkpoint_checks:load_side", spec, nproc=2, timeout=300).results
    return {r["check"]: r for r in results}


def test_probe(saved, resharded):
    import json
    print(json.dumps(saved, indent=1, default=str)[:20000])
    print(json.dumps(resharded, indent=1, default=str))
