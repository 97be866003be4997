"""Preference data: pairs and KTO rows in Hugging Face's formats become the SFT prompt/response tokens, bad
rows are reported with file and row, and the batches interleave, label and mismatch as the losses expect."""

from __future__ import annotations

import pytest
import torch

from megarl.config.schema import DataConfig
from megarl.data.files import DataError
from megarl.data.preference import (
    KTOExample,
    PreferencePair,
    batches,
    kl_partners,
    kto_batch,
    kto_kl_batch,
    load_kto_examples,
    load_preference_pairs,
    pair_batch,
)
from tests.helpers.data import write_jsonl, write_parquet

pytestmark = pytest.mark.unit

DATA = DataConfig()


def prompt_ids(tokenizer, prompt):
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]


def response_ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def test_standard_and_conversational_pairs_tokenise_like_sft(tmp_path, tokenizer):
    system = [{"role": "system", "content": "Answer briefly."}, user("sort 312")]
    standard = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "sort 312", "chosen": "123", "rejected": "312"}])
    conversational = write_parquet(
        tmp_path / "p.parquet",
        [{"prompt": system, "chosen": [assistant("123")], "rejected": [assistant("321")]}],
    )
    first, second = load_preference_pairs([standard, conversational], tokenizer, DATA, "data.train_files")
    assert first.prompt_ids == prompt_ids(tokenizer, "sort 312")
    assert first.chosen_ids == response_ids(tokenizer, "123")
    assert first.rejected_ids == response_ids(tokenizer, "312")
    assert second.prompt_ids == prompt_ids(tokenizer, system)
    assert second.chosen_ids == response_ids(tokenizer, "123")
    assert second.rejected_ids == response_ids(tokenizer, "321")
    assert (first.where, second.where) == ("p.jsonl line 1", "p.parquet row 0")


def test_implicit_prompt_is_the_shared_conversation_before_the_last_assistant_turn(tmp_path, tokenizer):
    context = [user("add 2 and 3"), assistant("5"), user("and 4 more?")]
    row = {"chosen": [*context, assistant("9")], "rejected": [*context, assistant("8")]}
    (pair,) = load_preference_pairs([write_parquet(tmp_path / "p.parquet", [row])], tokenizer, DATA, "k")
    assert pair.prompt_ids == prompt_ids(tokenizer, context)
    assert (pair.chosen_ids, pair.rejected_ids) == (
        response_ids(tokenizer, "9"),
        response_ids(tokenizer, "8"),
    )


def test_custom_column_names_are_read(tmp_path, tokenizer):
    data = DataConfig(prompt_key="question", chosen_key="good", rejected_key="bad")
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "sort 21", "good": "12", "bad": "21"}])
    (pair,) = load_preference_pairs([path], tokenizer, data, "k")
    assert pair == PreferencePair(
        "p.jsonl line 1",
        prompt_ids(tokenizer, "sort 21"),
        response_ids(tokenizer, "12"),
        response_ids(tokenizer, "21"),
    )


def test_kto_rows_accept_bool_and_0_1_labels_and_implicit_prompts(tmp_path, tokenizer):
    rows = [
        {"prompt": "sort 21", "completion": "12", "label": True},
        {"prompt": [user("sort 21")], "completion": [assistant("21")], "label": False},
        {"prompt": "reverse 12", "completion": "21", "label": 1},
        {"prompt": "reverse 12", "completion": "12", "label": 0},
        {"completion": [user("sort 43"), assistant("34")], "label": True},
    ]
    examples = load_kto_examples([write_jsonl(tmp_path / "k.jsonl", rows)], tokenizer, DATA, "k")
    assert [e.desirable for e in examples] == [True, False, True, False, True]
    assert all(type(e.desirable) is bool for e in examples)
    assert examples[1] == KTOExample(
        "k.jsonl line 2", prompt_ids(tokenizer, "sort 21"), response_ids(tokenizer, "21"), False
    )
    assert examples[3].prompt_ids == prompt_ids(tokenizer, "reverse 12")
    assert examples[4].prompt_ids == prompt_ids(tokenizer, "sort 43")
    assert examples[4].completion_ids == response_ids(tokenizer, "34")


def test_malformed_pairs_are_reported_with_file_and_row_and_skipped(tmp_path, tokenizer, caplog):
    rows = [
        {"prompt": "sort 21", "chosen": "12"},
        {"chosen": [user("a"), assistant("1")], "rejected": [user("b"), assistant("2")]},
        {"prompt": "sort 21", "chosen": [assistant("12"), assistant("12")], "rejected": "21"},
        {"prompt": "sort 21", "chosen": [user("12")], "rejected": "21"},
        {"prompt": "sort 21", "chosen": "12", "rejected": "12"},
        "not json",
        {"prompt": "sort 21", "chosen": "12", "rejected": "21"},
    ]
    pairs = load_preference_pairs([write_jsonl(tmp_path / "p.jsonl", rows)], tokenizer, DATA, "k")
    assert [p.where for p in pairs] == ["p.jsonl line 7"]
    out = caplog.text
    assert "megarl preference: skipped 6 malformed row(s):" in out
    assert "p.jsonl line 1: needs `chosen` and `rejected` columns (missing rejected)" in out
    assert "p.jsonl line 2: without a `prompt` column, `chosen` and `rejected` must share" in out
    assert (
        "p.jsonl line 3: `chosen` must be one assistant turn after the prompt (got [assistant, assistant])"
        in out
    )
    assert "p.jsonl line 4: `chosen` must be one assistant turn after the prompt (got [user])" in out
    assert "p.jsonl line 5: `chosen` and `rejected` are identical" in out
    assert "line 6" not in out  # at most 5 are shown


def test_bad_kto_labels_and_columns_are_reported(tmp_path, tokenizer, caplog):
    rows = [
        {"prompt": "sort 21", "completion": "12", "label": "yes"},
        {"prompt": "sort 21", "completion": "12", "label": 2},
        {"prompt": "sort 21", "completion": "12", "label": 1.0},
        {"prompt": "sort 21", "completion": "12"},
        {"prompt": "sort 21", "completion": [assistant("12")], "label": True},
    ]
    (example,) = load_kto_examples([write_jsonl(tmp_path / "k.jsonl", rows)], tokenizer, DATA, "k")
    assert example.where == "k.jsonl line 5"
    out = caplog.text
    assert "megarl kto: skipped 4 malformed row(s):" in out
    assert "k.jsonl line 1: `label` must be a bool (or 0/1), got 'yes'" in out
    assert "k.jsonl line 2: `label` must be a bool (or 0/1), got 2" in out
    assert "k.jsonl line 3: `label` must be a bool (or 0/1), got 1.0" in out
    assert "k.jsonl line 4: needs `completion` and `label` columns (missing label)" in out


def test_pairs_with_a_long_prompt_or_a_long_response_are_dropped_and_counted(tmp_path, tokenizer, caplog):
    short_prompt = len(prompt_ids(tokenizer, "sort 21"))
    data = DataConfig(max_prompt_length=short_prompt, max_response_length=3)
    rows = [
        {"prompt": "sort 21", "chosen": "12", "rejected": "21"},
        {"prompt": "sort 21 and then sort it again", "chosen": "12", "rejected": "21"},
        {"prompt": "sort 21", "chosen": "12", "rejected": "2121"},
        {"prompt": "sort 21", "chosen": "1212", "rejected": "21"},
    ]
    pairs = load_preference_pairs([write_jsonl(tmp_path / "p.jsonl", rows)], tokenizer, data, "k")
    assert [p.where for p in pairs] == ["p.jsonl line 1"]
    out = caplog.text
    assert (
        f"megarl preference: skipped 3 row(s) longer than data.max_prompt_length={short_prompt} / "
        "data.max_response_length=3 in p.jsonl: 3 (line 2, line 3, line 4)"
    ) in out
    assert "malformed" not in out


def test_no_usable_rows_raise_naming_the_config_key_and_the_columns(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "sort 21", "response": "12"}])
    with pytest.raises(
        DataError, match=r"data.train_files: no usable preference pairs in .*p.jsonl \(1 malformed"
    ):
        load_preference_pairs([path], tokenizer, DATA, "data.train_files")
    with pytest.raises(DataError, match="rows need `prompt`, `completion`.* and `label` \\(bool\\) columns"):
        load_kto_examples([path], tokenizer, DATA, "data.val_files")


def test_pair_batch_interleaves_chosen_and_rejected_with_sft_masks():
    pairs = [PreferencePair("a", [5, 6], [7], [8, 9, 2]), PreferencePair("b", [4], [1, 2], [3])]
    batch = pair_batch(pairs, pad_token_id=0)
    assert batch["prompts"].tolist() == [[5, 6], [5, 6], [0, 4], [0, 4]]
    assert batch["responses"].tolist() == [[7, 0, 0], [8, 9, 2], [1, 2, 0], [3, 0, 0]]
    assert batch["response_mask"].tolist() == [[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]]
    assert batch["attention_mask"].tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1],
        [0, 1, 1, 1, 0],
        [0, 1, 1, 0, 0],
    ]
    assert torch.equal(batch["input_ids"], torch.cat([batch["prompts"], batch["responses"]], 1))


def test_kto_batches_carry_the_label_and_the_kl_batch_shifts_completions():
    examples = [KTOExample(str(i), [10 + i], [20 + i] * (i + 1), i != 1) for i in range(3)]
    batch = kto_batch(examples, pad_token_id=0)
    assert batch["desirable"].dtype == torch.bool and batch["desirable"].tolist() == [True, False, True]
    assert batch["responses"][:, 0].tolist() == [20, 21, 22]
    kl = kto_kl_batch(examples, pad_token_id=0, partners=[1, 2, 0])
    assert kl["prompts"][:, 0].tolist() == [10, 11, 12]
    assert kl["responses"].tolist() == [[21, 21, 0], [22, 22, 22], [20, 0, 0]]
    assert kl["response_mask"].sum(1).tolist() == [2, 3, 1] and "desirable" not in kl
    some = kto_kl_batch(examples, pad_token_id=0, indices=[2, 0], partners=[1, 2, 0])
    assert some["responses"].tolist() == [[20, 0], [21, 21]]
    with pytest.raises(ValueError, match="needs ≥ 2 examples, got 1"):
        kto_kl_batch(examples[:1], pad_token_id=0)


def test_kl_partners_are_a_fixed_cycle_that_skips_completions_of_the_same_prompt():
    # both answers of each prompt on adjacent rows, as KTO data made from pairs usually has them
    examples = [KTOExample(str(i), [10 + i // 2], [20 + i], i % 2 == 0) for i in range(10)]
    partners = kl_partners(examples, seed=3)
    assert partners == kl_partners(examples, seed=3) and partners != kl_partners(examples, seed=4)
    assert all(examples[j].prompt_ids != examples[i].prompt_ids for i, j in enumerate(partners))
    same = [KTOExample(str(i), [1], [20 + i], True) for i in range(3)]  # no other prompt exists
    assert all(j != i for i, j in enumerate(kl_partners(same)))
    with pytest.raises(ValueError, match="needs ≥ 2 examples, got 1"):
        kl_partners(same[:1])


def test_batches_order_is_fixed_by_seed_and_epoch_and_drops_the_last_partial_batch():
    items = list(range(10))
    epoch0 = list(batches(items, 3, seed=7, epoch=0))
    assert epoch0 == list(batches(items, 3, seed=7, epoch=0))
    assert epoch0 != list(batches(items, 3, seed=7, epoch=1))
    assert epoch0 != list(batches(items, 3, seed=8, epoch=0))
    assert len(epoch0) == 3 and all(len(b) == 3 for b in epoch0)
    assert len({i for b in epoch0 for i in b}) == 9


def test_batches_keep_the_sft_order_of_earlier_releases():
    got = list(batches(list(range(6)), 2, seed=3, epoch=2))
    order = torch.randperm(6, generator=torch.Generator().manual_seed(3 * 100003 + 2)).tolist()
    assert got == [order[k : k + 2] for k in (0, 2, 4)]
