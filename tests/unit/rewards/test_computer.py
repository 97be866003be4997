"""RewardComputer: verl reward files unchanged, weighted terms, row failures counted, clear config errors."""

from __future__ import annotations

import logging
import textwrap

import pytest
import torch

from megarl.config.schema import OverlongBufferConfig, RewardFunctionConfig, RewardModelConfig
from megarl.protocol import Batch
from megarl.rewards import (
    RewardComputer,
    RewardError,
    known_data_sources,
    load_reward_function,
    overlong_penalty,
    varied_groups,
)

pytestmark = pytest.mark.unit

R = 6  # response width


def rollout(tokenizer, texts, sources, truths, extra=None, lengths=None) -> Batch:
    """A rollout-shaped batch: right-padded response tokens (EOS appended) + the prompt-side columns."""
    responses = torch.full((len(texts), R), tokenizer.pad_token_id)
    mask = torch.zeros(len(texts), R)
    for i, text in enumerate(texts):
        ids = tokenizer(text + tokenizer.eos_token)["input_ids"][:R]
        responses[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    tensors = {"responses": responses, "response_mask": mask, "index": torch.arange(10, 10 + len(texts))}
    columns = {"data_source": sources, "reward_model": [{"style": "rule", "ground_truth": t} for t in truths]}
    if extra is not None:
        columns["extra_info"] = extra
    return Batch(tensors, columns)


def reward_file(tmp_path, body: str, name: str = "my_reward.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_rule_rewards_by_data_source(tokenizer):
    batch = rollout(
        tokenizer,
        ["#### 7", "#### 8", "13459"],
        ["openai/gsm8k", "openai/gsm8k", "megarl/digits_sort"],
        ["7", "7", "13459"],
    )
    computer = RewardComputer(RewardModelConfig(), tokenizer)
    assert computer.response_texts(batch) == ["#### 7", "#### 8", "13459"]  # EOS dropped
    scores, metrics = computer.score(batch)
    assert scores.tolist() == [1.0, 0.0, 1.0] and scores.dtype == torch.float32
    assert metrics["reward/errors"] == 0
    assert metrics["reward/mean"] == pytest.approx(2 / 3)
    assert metrics["reward/source/openai/gsm8k/mean"] == 0.5
    assert metrics["reward/source/megarl/digits_sort/mean"] == 1.0


def test_a_verl_reward_file_works_unchanged_and_its_dict_keys_become_metrics(tmp_path, tokenizer):
    path = reward_file(
        tmp_path,
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            correct = solution_str.strip() == ground_truth
            return {"score": 2.0 if correct else -1.0, "acc": float(correct), "note": "text is ignored",
                    "offset": extra_info["offset"]}
        """,
    )
    cfg = RewardModelConfig(function=RewardFunctionConfig(path=path))
    batch = rollout(
        tokenizer, ["42", "41"], ["any/source", "other"], ["42", "42"], extra=[{"offset": 1}, {"offset": 3}]
    )
    scores, metrics = RewardComputer(cfg, tokenizer).score(batch)
    assert scores.tolist() == [2.0, -1.0]
    assert metrics["reward/acc/mean"] == 0.5 and metrics["reward/offset/mean"] == 2.0
    assert "reward/note/mean" not in metrics


def test_a_raising_reward_gives_that_row_zero_counts_it_and_logs_one_traceback(tmp_path, tokenizer, caplog):
    path = reward_file(
        tmp_path,
        """
        def score_it(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str == "boom":
                raise ValueError("cannot parse " + solution_str)
            return 1.0
        """,
    )
    computer = RewardComputer(
        # one worker: with two, row 2's failure can come back before row 1's (which one is logged first)
        RewardModelConfig(
            function=RewardFunctionConfig(path=path, name="score_it"), max_error_fraction=1.0, workers=1
        ),
        tokenizer,
    )
    batch = rollout(tokenizer, ["ok", "boom", "boom"], ["s"] * 3, ["x"] * 3)
    with caplog.at_level(logging.WARNING, logger="megarl.rewards"):
        scores, metrics = computer.score(batch)
        computer.score(batch)
    assert scores.tolist() == [1.0, 0.0, 0.0] and metrics["reward/errors"] == 2
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith(
        f"reward function score_it from {path} failed on batch row 1, dataset row 11 (data_source 's'): "
        "ValueError: cannot parse boom; that row scores 0 and counts in reward/errors (later failures are only "
        "counted).\nTraceback (most recent call last):\n"
    )
    assert message.endswith("ValueError: cannot parse boom")


@pytest.mark.parametrize(
    ("result", "why"),
    [
        ("None", "TypeError: the reward function returned None; expected a number or a dict with a 'score'"),
        ("'1.0'", "TypeError: the reward function returned a str ('1.0'); expected a number or a dict"),
        ("{'acc': 1.0}", "TypeError: the reward function returned a dict without a 'score' key: ['acc']"),
        ("float('nan')", "ValueError: the reward function returned nan; a score must be finite"),
        (
            "numpy.ones(3)",
            "TypeError: the reward function returned a ndarray of shape (3,); expected a number",
        ),
    ],
)
def test_a_result_that_is_not_a_score_counts_as_an_error(tmp_path, tokenizer, caplog, result, why):
    path = reward_file(
        tmp_path,
        "import numpy\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    return {result} if solution_str == 'bad' else numpy.float32(0.5)\n",
    )
    computer = RewardComputer(RewardModelConfig(function=RewardFunctionConfig(path=path)), tokenizer)
    with caplog.at_level(logging.WARNING, logger="megarl.rewards"):
        scores, metrics = computer.score(rollout(tokenizer, ["ok", "bad"], ["s"] * 2, ["a"] * 2))
    assert scores.tolist() == [0.5, 0.0] and metrics["reward/errors"] == 1  # a numpy scalar is a number
    assert why in caplog.records[0].getMessage()
    computer.close()


def test_unknown_data_source_without_a_function_names_source_row_and_fix(tokenizer):
    computer = RewardComputer(RewardModelConfig(), tokenizer)
    batch = rollout(tokenizer, ["a", "b"], ["openai/gsm8k", "my/private_set"], ["1", "2"])
    with pytest.raises(RewardError) as info:
        computer.score(batch)
    assert str(info.value) == (
        "no reward for data_source 'my/private_set' (batch row 1, dataset row 11) and reward.function.path is "
        "not set; set reward.function.path=/path/to/reward.py (defining compute_score(data_source, solution_str, "
        f"ground_truth, extra_info=None)) or use a known data_source: {', '.join(known_data_sources())} (or any "
        "name starting with 'aime' or containing 'countdown')"
    )
    computer.check_data_sources(["numina_olympiads", "hiyouga/geometry3k"], "data.train_files")  # verl's too
    with pytest.raises(
        RewardError, match=r"^no reward for data_source 'my/private_set' \(data.train_files\)"
    ):
        computer.check_data_sources(["openai/gsm8k", "my/private_set"], "data.train_files")
    computer.check_data_sources(["openai/gsm8k", "countdown_3to4"])
    # With the rule term switched off, only the reward model scores: nothing to look up.
    RewardComputer(RewardModelConfig(weights={"function": 0.0}), tokenizer).check_data_sources(
        ["my/private_set"]
    )


def test_weighted_terms_sum_rule_rm_and_a_stage_column(tokenizer):
    batch = rollout(tokenizer, ["#### 1", "#### 2"], ["openai/gsm8k"] * 2, ["1", "1"])
    batch["rm_scores"] = torch.tensor([0.5, -0.5])
    batch["curriculum"] = torch.tensor([1.0, 2.0])
    default = RewardComputer(RewardModelConfig(), tokenizer)
    assert default.score(batch)[0].tolist() == [
        1.5,
        -0.5,
    ]  # every present term weighs 1; extra columns need a weight
    weighted = RewardComputer(
        RewardModelConfig(weights={"function": 2.0, "rm": 0.5, "curriculum": 0.25}), tokenizer
    )
    scores, metrics = weighted.score(batch)
    assert scores.tolist() == [2.0 + 0.25 + 0.25, -0.25 + 0.5]
    assert metrics["reward/rm/mean"] == 0.0 and metrics["reward/curriculum/mean"] == 1.5
    rm_only = RewardComputer(RewardModelConfig(weights={"function": 0.0}), tokenizer)
    scores, metrics = rm_only.score(batch)
    assert scores.tolist() == [0.5, -0.5] and "reward/errors" not in metrics


def test_a_weighted_term_with_no_column_is_an_error(tokenizer):
    batch = rollout(tokenizer, ["#### 1"], ["openai/gsm8k"], ["1"])
    with pytest.raises(RewardError, match=r"^reward.weights.rm=0.5 but the batch has no rm_scores column"):
        RewardComputer(RewardModelConfig(weights={"rm": 0.5}), tokenizer).score(batch)
    with pytest.raises(
        RewardError, match=r"^reward.weights.bonus=1.0 names a reward term, but the batch has no 'bonus'"
    ):
        RewardComputer(RewardModelConfig(weights={"bonus": 1.0}), tokenizer).score(batch)


def test_overlong_penalty_is_linear_in_the_buffer():
    lengths = torch.tensor([0, 12, 14, 16, 20])
    penalty = overlong_penalty(lengths, max_response_length=20, buffer_len=8, penalty_factor=1.0)
    assert penalty.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(lengths, 20, 8, 0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5]
    with pytest.raises(ValueError, match=r"buffer_len=0 must be in \[1, max_response_length=20\]"):
        overlong_penalty(lengths, 20, 0, 1.0)


def test_overlong_penalty_is_added_to_the_reward(tokenizer):
    batch = rollout(
        tokenizer, ["13459", "1"], ["megarl/digits_sort"] * 2, ["13459", "13459"]
    )  # 6 and 2 tokens
    cfg = RewardModelConfig(overlong_buffer=OverlongBufferConfig(enable=True, len=4, penalty_factor=1.0))
    scores, metrics = RewardComputer(cfg, tokenizer, max_response_length=R).score(batch)
    assert scores.tolist() == [1.0 - 1.0, 0.0]
    assert metrics["reward/overlong/frac"] == 0.5 and metrics["reward/overlong_penalty/mean"] == -0.5


def test_loading_a_reward_file_reports_what_is_wrong(tmp_path):
    with pytest.raises(
        RewardError, match=r"reward.function.path=.*/none.py does not exist; point it at a .py file"
    ):
        load_reward_function(str(tmp_path / "none.py"))
    broken = reward_file(tmp_path, "import not_a_module_anywhere\n", "broken.py")
    with pytest.raises(
        RewardError, match=r"failed to import: ModuleNotFoundError: .*not_a_module_anywhere.*; fix the file"
    ):
        load_reward_function(broken)
    other = reward_file(tmp_path, "import os\ndef my_score(*a, **k):\n    return 1.0\n", "other.py")
    with pytest.raises(RewardError) as info:
        load_reward_function(other)
    assert str(info.value) == (
        f"{other} has no reward function 'compute_score': it does not define it; set reward.function.name to "
        "one of its functions: my_score"
    )
    number = reward_file(tmp_path, "compute_score = 5\n", "number.py")
    with pytest.raises(RewardError) as info:
        load_reward_function(number)
    assert str(info.value) == (
        f"{number} has no reward function 'compute_score': it defines compute_score as int, not a function; "
        "define `def compute_score(data_source, solution_str, ground_truth, extra_info=None)` in it"
    )
    exits = reward_file(tmp_path, "import sys\nsys.exit(3)\n", "exits.py")
    with pytest.raises(RewardError) as info:
        load_reward_function(exits)
    assert str(info.value) == (
        f"reward.function.path={exits} called sys.exit(3) while being imported; a reward file must only "
        'define functions at import (move the code under `if __name__ == "__main__":`)'
    )


def test_dynamic_sampling_keeps_groups_whose_rewards_differ():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5])
    keep = varied_groups(scores, torch.tensor([0, 0, 1, 1, 2, 2, 3]))
    assert keep.tolist() == [False, False, True, True, False, False, True]
    assert varied_groups(scores[:4], ["b", "a", "b", "a"]).tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="3 group ids for 7 scores"):
        varied_groups(scores, [0, 0, 1])


def test_scores_the_rollout_of_a_dataset_batch_end_to_end(tmp_path, tokenizer):
    """make_task -> PromptDataset batch -> the rollout schema (rollout_batch) -> RewardComputer."""
    from megarl.data.datasets import PromptDataset
    from megarl.data.tasks import make_task
    from megarl.rollout.base import Sample, rollout_batch

    files = make_task("digits_sort", tmp_path, n_train=8, n_val=4, n_sft=4)
    prompts = PromptDataset([str(files.val)], tokenizer, 24).batch([0, 1])
    truths = list(prompts["ground_truth"])

    def sample(text):
        ids = tokenizer(text + tokenizer.eos_token)["input_ids"]
        return Sample(ids, [-0.1] * len(ids), "stop")

    samples = [[sample(truths[0]), sample("0")], [sample("9"), sample(truths[1])]]
    batch = rollout_batch(prompts, samples, max_tokens=8, pad_token_id=tokenizer.pad_token_id)
    scores, metrics = RewardComputer(RewardModelConfig(), tokenizer).score(batch)
    assert scores.tolist() == [1.0, 0.0, 0.0, 1.0] and metrics["reward/function/mean"] == 0.5


def test_reads_names_every_column_a_score_reads(tokenizer):
    default = RewardComputer(RewardModelConfig(), tokenizer)
    prompt_side = ("data_source", "ground_truth", "extra_info")
    assert default.reads(reward_model=False) == ("responses", "response_mask", *prompt_side)
    assert default.reads(reward_model=True)[-1] == "rm_scores"
    weighted = RewardComputer(
        RewardModelConfig(weights={"function": 0.0, "curriculum": 0.25, "off": 0.0}), tokenizer
    )
    assert weighted.reads(reward_model=True) == ("rm_scores", "curriculum")
    assert weighted.column_terms == ("curriculum",)
    overlong = RewardModelConfig(weights={"function": 0.0}, overlong_buffer=OverlongBufferConfig(enable=True))
    assert RewardComputer(overlong, tokenizer, 8).reads(reward_model=False) == ("responses", "response_mask")
