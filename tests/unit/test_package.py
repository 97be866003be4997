"""`import megarl` and the CLI's parser: cheap (no torch, megatron or ray), and every exported name
resolves."""

import subprocess
import sys

import pytest

import megarl

pytestmark = pytest.mark.unit


def test_import_megarl_loads_no_heavy_framework():
    code = "import sys, megarl; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron', 'ray'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_clis_parser_loads_no_heavy_framework():
    """Every command's arguments are registered at start-up: a bad config or a run directory in use is
    refused in about a second, not after torch and transformers have loaded (≈ 4 s)."""
    code = (
        "import sys\nfrom megarl.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = {'torch', 'megatron', 'ray', 'transformers', 'tensordict', 'vllm'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip() == "[]"


def test_all_lists_exactly_the_lazy_exports():
    assert set(megarl.__all__) == {"__version__", *megarl._EXPORTS}


@pytest.mark.parametrize("name", megarl.__all__)
def test_every_exported_name_resolves(name):
    assert getattr(megarl, name) is not None
    assert name in dir(megarl)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'PPOTrainr'"):
        megarl.PPOTrainr  # noqa: B018
