"""SFT rows under verl's SFT keys: nested columns (data.prompt_dict_keys / data.response_dict_keys and the
dotted form) read the same pairs as flat prompt/response columns, multi-turn conversations give one
example per assistant turn, and unusable rows name the file, the row, the column and what is there."""

from __future__ import annotations

import pytest

from megarl.config.schema import DataConfig, SFTMultiturnConfig
from megarl.data.files import DataError
from megarl.data.sft import encode_prompt, encode_response, load_sft_examples
from tests.helpers.data import write_parquet

pytestmark = pytest.mark.unit

PROBLEMS = [("What is 12 + 7?", "12 + 7 = 19\n#### 19"), ("What is 3 * 4?", "3 * 4 = 12\n#### 12")]


def _gsm8k_rows() -> list[dict]:
    """Rows in the schema of verl's examples/data_preprocess/gsm8k.py output."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": q + " Let's think step by step."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": a.split("#### ")[1]},
            "extra_info": {"split": "train", "index": i, "answer": a, "question": q},
        }
        for i, (q, a) in enumerate(PROBLEMS)
    ]


def _ids(examples) -> list[tuple[list[int], list[int]]]:
    return [(e.prompt_ids, e.response_ids) for e in examples]


def _expected(tokenizer, pairs, data: DataConfig) -> list[tuple[list[int], list[int]]]:
    return [(encode_prompt(p, tokenizer, data), encode_response(r, tokenizer, data)) for p, r in pairs]


@pytest.mark.parametrize(
    "keys",
    [
        # verl's examples/sft/gsm8k scripts
        dict(
            prompt_key="extra_info",
            prompt_dict_keys=["question"],
            response_key="extra_info",
            response_dict_keys=["answer"],
        ),
        # the dotted form
        dict(prompt_key="extra_info.question", response_key="extra_info.answer"),
        dict(prompt_key="extra_info.question", response_key="extra_info", response_dict_keys=["answer"]),
    ],
)
def test_verl_sft_keys_read_nested_columns_of_a_gsm8k_parquet(tmp_path, tokenizer, keys):
    path = write_parquet(tmp_path / "train.parquet", _gsm8k_rows())
    data = DataConfig(max_prompt_length=64, max_response_length=32, **keys)
    assert _ids(load_sft_examples([path], tokenizer, data, "data.train_files")) == _expected(
        tokenizer, PROBLEMS, data
    )


def test_a_column_named_with_a_dot_is_read_before_the_nested_path(tmp_path, tokenizer):
    rows = [{"q.text": q, "extra_info": {"q": {"text": "nested"}}, "response": a} for q, a in PROBLEMS]
    path = write_parquet(tmp_path / "train.parquet", rows)
    data = DataConfig(prompt_key="q.text", max_prompt_length=64, max_response_length=32)
    assert _ids(load_sft_examples([path], tokenizer, data, "data.train_files")) == _expected(
        tokenizer, PROBLEMS, data
    )


def test_multiturn_gives_one_example_per_assistant_turn(tmp_path, tokenizer):
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And times 3?"},
        {"role": "assistant", "content": "12"},
    ]
    path = write_parquet(tmp_path / "train.parquet", [{"conversation": conversation, "id": 0}])
    data = DataConfig(
        multiturn=SFTMultiturnConfig(enable=True, messages_key="conversation"),
        max_prompt_length=128,
        max_response_length=16,
    )
    expected = _expected(tokenizer, [(conversation[:2], "4"), (conversation[:4], "12")], data)
    assert _ids(load_sft_examples([path], tokenizer, data, "data.train_files")) == expected


def _error(tmp_path, tokenizer, rows, **keys) -> str:
    path = write_parquet(tmp_path / "train.parquet", rows)
    data = DataConfig(max_prompt_length=64, max_response_length=32, **keys)
    with pytest.raises(DataError) as e:
        load_sft_examples([path], tokenizer, data, "data.train_files")
    return str(e.value)


def test_a_missing_column_names_the_file_row_key_and_the_columns_present(tmp_path, tokenizer):
    message = _error(tmp_path, tokenizer, _gsm8k_rows(), prompt_key="question", response_dict_keys=["answer"])
    assert message.startswith("data.train_files: no usable SFT rows in"), message
    assert (
        "train.parquet row 0: no column 'question' (data.prompt_key=question); the columns present: "
        "data_source, prompt, ability, reward_model, extra_info" in message
    ), message
    assert "Rows need the prompt at question and the response at response.answer" in message


def test_a_missing_nested_key_lists_the_keys_there(tmp_path, tokenizer):
    message = _error(
        tmp_path,
        tokenizer,
        _gsm8k_rows(),
        prompt_key="extra_info.question",
        response_key="extra_info.solution",
    )
    assert (
        "train.parquet row 0: column extra_info has no key 'solution' (data.response_key=extra_info.solution); "
        "its keys: split, index, answer, question" in message
    ), message


def test_indexing_into_a_non_struct_column_says_what_it_is(tmp_path, tokenizer):
    message = _error(
        tmp_path, tokenizer, _gsm8k_rows(), prompt_key="data_source", prompt_dict_keys=["question"]
    )
    assert (
        "train.parquet row 0: column data_source is a str, not a struct with key 'question' "
        "(data.prompt_key=data_source)" in message
    ), message


def test_multiturn_without_the_messages_column_lists_the_columns(tmp_path, tokenizer):
    message = _error(tmp_path, tokenizer, _gsm8k_rows(), multiturn=SFTMultiturnConfig(enable=True))
    assert (
        "train.parquet row 0: no column 'messages' (data.multiturn.messages_key=messages); the columns "
        "present: data_source, prompt, ability, reward_model, extra_info" in message
    ), message
    assert "Rows need a 'messages' chat list (data.multiturn.messages_key)" in message


def test_multiturn_without_an_assistant_turn_is_refused(tmp_path, tokenizer):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "there"}]}]
    message = _error(tmp_path, tokenizer, rows, multiturn=SFTMultiturnConfig(enable=True))
    assert "row 0: column 'messages' has no assistant turn after another turn to train on" in message
