"""The Hugging Face export (`<trainer.output_dir>/hf`) never replaces a model the run starts from:
refused when the config is loaded, before any process starts or anything is written."""

from pathlib import Path

import pytest

from megarl.config import ConfigError, load_config

pytestmark = pytest.mark.unit

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.mark.parametrize(("model", "how"), [("hf", "is"), ("hf/policy", "contains"), (".", "lies inside")])
def test_save_hf_over_the_starting_model_is_refused_at_load(tmp_path, model, how):
    out = tmp_path / "run"
    model_path = (out / model).resolve()
    overrides = [f"trainer.output_dir={out}", f"model.path={model_path}", "trainer.save_hf=true"]
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "quickstart_grpo.yaml", overrides, check_paths=False)
    assert (
        f"trainer.save_hf=true writes the Hugging Face model to {out / 'hf'}, which {how} model.path={model_path}: "
        "the export would overwrite the model it starts from; set trainer.output_dir to another directory "
        "(or copy the model elsewhere first)"
    ) in str(e.value)
    load_config(CONFIGS / "quickstart_grpo.yaml", overrides[:2], check_paths=False)  # no export: fine
    assert not out.exists()


def test_sft_always_exports_so_its_model_path_is_checked_without_save_hf(tmp_path):
    out = tmp_path / "run"
    overrides = ["algorithm.name=sft", f"trainer.output_dir={out}", f"model.tokenizer_path={out / 'hf'}"]
    with pytest.raises(
        ConfigError, match=r"this job writes the Hugging Face model to .*model.tokenizer_path="
    ):
        load_config(CONFIGS / "quickstart_sft.yaml", overrides, check_paths=False)
