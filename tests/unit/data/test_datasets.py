"""PromptDataset: verl-schema files read unchanged, bad rows reported with file and row, batches the rollout
accepts."""

from __future__ import annotations

import logging
import pickle

import pytest
import torch

from megarl.config.schema import DataConfig
from megarl.data.datasets import DataError, PromptDataset
from megarl.rollout.base import prompt_token_ids
from tests.helpers.data import verl_row, write_jsonl, write_parquet

pytestmark = pytest.mark.unit

QUESTIONS = ["12 + 7 =", "What is 3 * 4?", "the sum of 5 and 6"]


@pytest.fixture
def gsm8k_file(tmp_path):
    rows = [verl_row(q, str(i), extra_info={"split": "train", "index": i}) for i, q in enumerate(QUESTIONS)]
    return write_parquet(tmp_path / "train.parquet", rows)


def chat_ids(tokenizer, question):
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]


def test_verl_parquet_rows_become_left_padded_prompt_batches(gsm8k_file, tokenizer):
    ds = PromptDataset([gsm8k_file], tokenizer, max_prompt_length=64)
    assert len(ds) == 3 and ds.data_sources == ["openai/gsm8k"]
    batch = ds.batch([2, 0])
    assert prompt_token_ids(batch) == [chat_ids(tokenizer, QUESTIONS[2]), chat_ids(tokenizer, QUESTIONS[0])]
    assert batch["prompts"].dtype == torch.long and batch["attention_mask"].dtype == torch.long
    shorter = len(chat_ids(tokenizer, QUESTIONS[0]))
    width = batch["prompts"].shape[1]
    assert batch["prompts"][1, : width - shorter].eq(tokenizer.pad_token_id).all()
    assert batch["index"].tolist() == [2, 0]
    assert list(batch["ground_truth"]) == ["2", "0"]
    assert list(batch["data_source"]) == ["openai/gsm8k"] * 2
    assert batch["reward_model"][0] == {"style": "rule", "ground_truth": "2"}
    assert batch["extra_info"][1] == {"split": "train", "index": 0}
    assert list(batch["ability"]) == ["math", "math"]
    assert batch["raw_prompt"][0] == [{"role": "user", "content": QUESTIONS[2]}]
    assert batch["prompt_text"][0].endswith("<|im_start|>assistant\n")
    assert pickle.loads(pickle.dumps(batch))["raw_prompt"][1] == batch["raw_prompt"][1]


def test_string_prompts_are_wrapped_in_the_template_or_tokenised_as_is(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"data_source": "x", "prompt": "12 + 7 ="}])
    templated = PromptDataset([path], tokenizer, 64)
    assert templated[0].prompt_ids == chat_ids(tokenizer, "12 + 7 =")
    assert templated[0].raw_prompt == [{"role": "user", "content": "12 + 7 ="}]
    plain = PromptDataset([path], tokenizer, 64, apply_chat_template=False)
    assert plain[0].prompt_ids == tokenizer("12 + 7 =")["input_ids"]
    assert plain[0].prompt_text == "12 + 7 ="


def test_chat_list_without_a_template_is_an_error(gsm8k_file, tokenizer):
    with pytest.raises(DataError) as info:
        PromptDataset([gsm8k_file], tokenizer, 64, apply_chat_template=False)
    assert str(info.value) == (
        "data.train_files: train.parquet row 0: the prompt is a chat list but data.apply_chat_template=false; "
        "use a tokenizer with a chat template and data.apply_chat_template=true, or give plain-string prompts"
    )


def test_missing_file_names_the_file_and_the_key(tmp_path, tokenizer):
    missing = tmp_path / "nope" / "train.parquet"
    with pytest.raises(DataError) as info:
        PromptDataset([str(missing)], tokenizer, 64)
    assert str(info.value) == (
        f"data.train_files: {missing} does not exist; fix the path (data.train_files=[path/to/train.parquet]) "
        "or create the dataset first (e.g. `megarl data make digits_sort --out DIR`)"
    )
    with pytest.raises(DataError, match=r"^data.val_files: .* does not exist"):
        PromptDataset.from_config(DataConfig(val_files=[str(missing)]), tokenizer, split="val")


def test_a_row_without_a_prompt_is_skipped_and_reported(tmp_path, tokenizer, caplog):
    rows = [verl_row("12 + 7 =", "19"), verl_row("3 * 4 =", "12"), verl_row("5 - 1 =", "4")]
    del rows[1]["prompt"]
    path = write_parquet(tmp_path / "train.parquet", rows)
    with caplog.at_level(logging.WARNING, logger="megarl.data"):
        ds = PromptDataset([path], tokenizer, 64)
    assert [r.ground_truth for r in ds.rows] == ["19", "4"]
    assert ds.report.malformed == {"no 'prompt' field": ["train.parquet row 1"]}
    assert [r.getMessage() for r in caplog.records] == [
        "data.train_files: skipped 1 malformed of 3 rows: no 'prompt' field (1: train.parquet row 1)"
    ]


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ({"prompt": ""}, "empty prompt string"),
        ({"prompt": []}, "empty chat list"),
        ({"prompt": 7}, "prompt is int, expected a chat list of {role, content} or a string"),
        ({"prompt": [{"role": "user"}]}, "message 0 has no string 'content'"),
        ({"prompt": ["hi"]}, "message 0 is str, expected a {role, content} dict"),
        ({"prompt": [{"role": "user", "content": " "}]}, "every message of the chat list is empty"),
        ({"extra_info": "oops"}, "extra_info is str, expected a dict"),
        ("{not json", "not valid JSON (Expecting property name enclosed in double quotes)"),
        ("[1, 2]", "not a JSON object (got list)"),
    ],
)
def test_malformed_jsonl_rows_name_the_line_and_the_problem(tmp_path, tokenizer, bad, problem):
    good = {"data_source": "x", "prompt": "1 + 1 ="}
    broken = {**good, **bad} if isinstance(bad, dict) else bad
    path = write_jsonl(tmp_path / "train.jsonl", [good, broken])
    ds = PromptDataset([path], tokenizer, 64)
    assert len(ds) == 1
    assert ds.report.malformed == {problem: ["train.jsonl line 2"]}


def test_no_usable_row_raises_with_counts_rows_and_fixes(tmp_path, tokenizer):
    a = write_parquet(tmp_path / "a.parquet", [{"data_source": "x", "question": "1 + 1 ="}] * 7)
    b = write_jsonl(tmp_path / "b.jsonl", [{"data_source": "x", "prompt": "1 + 1 = " * 40}])
    longest = len(chat_ids(tokenizer, "1 + 1 = " * 40))
    with pytest.raises(DataError) as info:
        PromptDataset([a, b], tokenizer, 16)
    assert str(info.value) == (
        f"data.train_files: no usable prompt in {a}, {b} (8 rows read): 7 rows: no 'prompt' field "
        "(a.parquet row 0, a.parquet row 1, a.parquet row 2, a.parquet row 3, a.parquet row 4, ... (2 more)); "
        f"1 prompt longer than data.max_prompt_length=16 tokens (longest {longest}) in b.jsonl: 1 (line 1). Fix: give "
        "every row a 'prompt' (a chat list of {role, content} or a non-empty string; set data.prompt_key if the "
        f"column has another name); raise data.max_prompt_length to at least {longest}"
    )


def test_all_prompts_too_long_raises(gsm8k_file, tokenizer):
    lengths = [len(chat_ids(tokenizer, q)) for q in QUESTIONS]
    with pytest.raises(DataError) as info:
        PromptDataset([gsm8k_file], tokenizer, 5)
    assert str(info.value) == (
        f"data.train_files: no usable prompt in {gsm8k_file} (3 rows read): 3 prompts longer than "
        f"data.max_prompt_length=5 tokens (longest {max(lengths)}) in train.parquet: 3 (row 0, row 1, row 2). "
        f"Fix: raise data.max_prompt_length to at least {max(lengths)}"
    )


def test_overlong_prompts_are_dropped_and_counted_in_one_warning(gsm8k_file, tokenizer, caplog):
    lengths = [len(chat_ids(tokenizer, q)) for q in QUESTIONS]
    limit = sorted(lengths)[1]
    with caplog.at_level(logging.WARNING, logger="megarl.data"):
        ds = PromptDataset([gsm8k_file], tokenizer, limit)
    kept = [q for q, n in zip(QUESTIONS, lengths) if n <= limit]
    assert [r.raw_prompt[0]["content"] for r in ds.rows] == kept
    dropped = [(f"train.parquet row {i}", n) for i, n in enumerate(lengths) if n > limit]
    assert ds.report.too_long == dropped and len(dropped) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"data.train_files: dropped 1 prompt longer than data.max_prompt_length={limit} tokens "
        f"(longest {max(lengths)}) in train.parquet: 1 ({dropped[0][0].removeprefix('train.parquet ')}); "
        "raise data.max_prompt_length to keep them"
    ]


def test_overlong_prompts_are_an_error_when_filtering_is_off(gsm8k_file, tokenizer):
    with pytest.raises(DataError, match=r"or set data.filter_overlong_prompts=true to drop them$"):
        PromptDataset([gsm8k_file], tokenizer, 5, filter_overlong_prompts=False)


def test_from_config_reads_the_prompt_key_and_flags(tmp_path, tokenizer):
    rows = [{"data_source": "x", "question": [{"role": "user", "content": q}]} for q in QUESTIONS]
    path = write_parquet(tmp_path / "q.parquet", rows)
    cfg = DataConfig(train_files=[path], prompt_key="question", max_prompt_length=64)
    ds = PromptDataset.from_config(cfg, tokenizer)
    assert [r.prompt_ids for r in ds.rows] == [chat_ids(tokenizer, q) for q in QUESTIONS]
    assert ds[0].ground_truth is None and ds[0].extra_info == {} and ds[0].ability is None


def test_validation_batches_cover_every_row_in_order(gsm8k_file, tokenizer):
    ds = PromptDataset([gsm8k_file], tokenizer, 64)
    assert [b["index"].tolist() for b in ds.batches(2)] == [[0, 1], [2]]


def test_a_json_list_file_is_read_row_by_row(tmp_path, tokenizer):
    path = tmp_path / "p.json"
    path.write_text('[{"data_source": "x", "prompt": "1 + 1 ="}, {"data_source": "x"}]')
    ds = PromptDataset([str(path)], tokenizer, 64)
    assert len(ds) == 1 and ds.report.malformed == {"no 'prompt' field": ["p.json row 1"]}


def test_rows_without_a_ground_truth_are_reported_when_the_rewards_need_one(tmp_path, tokenizer, caplog):
    rows = [verl_row("12 + 7 =", "19"), verl_row("3 * 4 =", "12"), verl_row("5 - 1 =", "4")]
    rows[1]["reward_model"] = None
    del rows[2]["reward_model"]["ground_truth"]
    path = write_parquet(tmp_path / "train.parquet", rows)
    assert len(PromptDataset([path], tokenizer, 64)) == 3  # a reward function of the user's may need none
    with caplog.at_level(logging.WARNING, logger="megarl.data"):
        ds = PromptDataset([path], tokenizer, 64, require_ground_truth=True)
    assert [r.ground_truth for r in ds.rows] == ["19"]
    assert [r.getMessage() for r in caplog.records] == [
        "data.train_files: skipped 2 malformed of 3 rows: no ground truth (reward_model.ground_truth), which the "
        "rule rewards compare with (2: train.parquet row 1, train.parquet row 2)"
    ]
    only_bad = write_parquet(tmp_path / "bad.parquet", rows[1:])
    with pytest.raises(DataError) as info:
        PromptDataset([only_bad], tokenizer, 64, require_ground_truth=True)
    assert str(info.value) == (
        f"data.train_files: no usable prompt in {only_bad} (2 rows read): 2 rows: no ground truth "
        "(reward_model.ground_truth), which the rule rewards compare with (bad.parquet row 0, bad.parquet row 1). "
        "Fix: give every row a reward_model.ground_truth (or set reward.function.path to a reward function that "
        "needs none)"
    )
