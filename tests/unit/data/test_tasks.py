"""make_task: verl-schema digit tasks, short under the tiny tokenizer, held-out val, exact-match rewards."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from megarl.config.schema import DataConfig
from megarl.data.datasets import PromptDataset
from megarl.data.preference import load_kto_examples, load_preference_pairs
from megarl.data.tasks import DIGIT_TASKS, make_task
from megarl.rewards import default_compute_score

pytestmark = pytest.mark.unit


def solve(task: str, prompt: str) -> str:
    if task == "digits_add":
        a, b = prompt.removesuffix(" =").split(" + ")
        return str(int(a) + int(b))
    digits = prompt.split()[1]
    return "".join(sorted(digits)) if task == "digits_sort" else digits[::-1]


@pytest.mark.parametrize("task", DIGIT_TASKS)
def test_task_files_are_verl_schema_short_and_correct(tmp_path, tokenizer, task):
    files = make_task(task, tmp_path, n_train=200, n_val=40, n_sft=100, seed=3)
    train, val = pq.read_table(files.train).to_pylist(), pq.read_table(files.val).to_pylist()
    sft = pq.read_table(files.sft).to_pylist()
    assert (len(train), len(val), len(sft)) == (200, 40, 100)
    row = train[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == f"megarl/{task}" and row["reward_model"]["style"] == "rule"
    for r in train + val:
        (message,) = r["prompt"]
        assert message["role"] == "user"
        assert r["reward_model"]["ground_truth"] == solve(task, message["content"])
    assert {r["prompt"][0]["content"] for r in val}.isdisjoint(
        {r["prompt"][0]["content"] for r in train} | {r["prompt"] for r in sft}
    )
    for r in sft:
        assert r["response"] == solve(task, r["prompt"])
        assert r["messages"] == [
            {"role": "user", "content": r["prompt"]},
            {"role": "assistant", "content": r["response"]},
        ]

    ds = PromptDataset([str(files.train), str(files.val)], tokenizer, max_prompt_length=24)
    assert len(ds) == 240 and ds.report.too_long == [] and not ds.report.malformed
    answers = [tokenizer(r["response"] + tokenizer.eos_token)["input_ids"] for r in sft]
    assert max(len(a) for a in answers) <= 8
    # The SFT file's string prompt renders to the very tokens of the RL chat-list prompt.
    messages = [{"role": "user", "content": sft[0]["prompt"]}]
    rl_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)[
        "input_ids"
    ]
    assert PromptDataset([str(files.sft)], tokenizer, 24)[0].prompt_ids == rl_ids


@pytest.mark.parametrize("task", DIGIT_TASKS)
def test_ground_truth_scores_one_and_a_wrong_answer_zero(tmp_path, task):
    row = pq.read_table(make_task(task, tmp_path, n_train=4, n_val=4, n_sft=4).val).to_pylist()[0]
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score(row["data_source"], f" {truth}\n", truth) == 1.0
    assert default_compute_score(row["data_source"], truth + "0", truth) == 0.0


@pytest.mark.parametrize("task", DIGIT_TASKS)
def test_preference_and_kto_files_pair_the_answer_with_a_plausible_wrong_one(tmp_path, tokenizer, task):
    files = make_task(task, tmp_path, n_train=20, n_val=40, n_sft=20, seed=3, n_pref=200)
    val = {r["prompt"][0]["content"] for r in pq.read_table(files.val).to_pylist()}
    pairs, kto = pq.read_table(files.preference).to_pylist(), pq.read_table(files.kto).to_pylist()
    assert len(pairs) == len(kto) == 200
    assert set(pairs[0]) == {"prompt", "chosen", "rejected", "data_source"}
    assert set(kto[0]) == {"prompt", "completion", "label", "data_source"}
    for r in pairs:
        assert r["chosen"] == solve(task, r["prompt"]) != r["rejected"]
        if task == "digits_add":
            assert int(r["rejected"]) >= 0 and 1 <= abs(int(r["rejected"]) - int(r["chosen"])) <= 9
        else:
            assert r["rejected"] == r["prompt"].split()[1]
    assert sum(r["label"] for r in kto) == 100
    assert 30 < sum(r["label"] for r in kto[:100]) < 70  # shuffled, not in blocks
    for r in kto:
        assert (r["completion"] == solve(task, r["prompt"])) == r["label"]
    assert val.isdisjoint(r["prompt"] for r in pairs + kto)
    data = DataConfig(max_prompt_length=24, max_response_length=8)
    assert len(load_preference_pairs([str(files.preference)], tokenizer, data, "k")) == 200
    assert len(load_kto_examples([str(files.kto)], tokenizer, data, "k")) == 200


def test_n_pref_leaves_the_other_files_unchanged(tmp_path):
    a = make_task("digits_reverse", tmp_path / "a", n_train=30, n_val=10, n_sft=10, n_pref=10)
    b = make_task("digits_reverse", tmp_path / "b", n_train=30, n_val=10, n_sft=10, n_pref=50)
    for split in ("train", "val", "sft"):
        assert pq.read_table(getattr(a, split)).equals(pq.read_table(getattr(b, split)))


def test_same_seed_same_files_other_seed_differs(tmp_path):
    a = make_task("digits_sort", tmp_path / "a", n_train=50, n_val=10, n_sft=10, seed=1)
    b = make_task("digits_sort", tmp_path / "b", n_train=50, n_val=10, n_sft=10, seed=1)
    c = make_task("digits_sort", tmp_path / "c", n_train=50, n_val=10, n_sft=10, seed=2)
    assert pq.read_table(a.train).equals(pq.read_table(b.train))
    assert pq.read_table(a.preference).equals(pq.read_table(b.preference))
    assert pq.read_table(a.kto).equals(pq.read_table(b.kto))
    assert not pq.read_table(a.train).equals(pq.read_table(c.train))


def test_unknown_task_lists_the_known_ones(tmp_path):
    with pytest.raises(
        ValueError,
        match="unknown task 'digits_mul'; use one of calc_tool, digits_add, digits_reverse, digits_sort",
    ):
        make_task("digits_mul", tmp_path)
