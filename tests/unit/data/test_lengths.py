"""The character bound beyond which a text is surely too long to tokenise: never below the real token
count, so no prompt that fits is dropped; and the prompts beyond it are dropped untokenised, per file."""

from __future__ import annotations

import logging

import pytest

from megarl.config.schema import DataConfig
from megarl.data.datasets import PromptDataset
from megarl.data.lengths import capped_token_ids, char_limit
from megarl.data.sft import encode_prompt, encode_response
from tests.helpers.data import write_jsonl, write_parquet

pytestmark = pytest.mark.unit


def test_the_worst_text_at_the_bound_still_has_more_tokens_than_the_limit(tokenizer):
    """The text with the most characters per token repeats the vocabulary's longest entry."""
    longest = max(tokenizer.get_vocab(), key=len)
    text = tokenizer.convert_tokens_to_string([longest])
    for max_tokens in (1, 8, 64):
        limit = char_limit(tokenizer, max_tokens)
        worst = (text * (limit // len(text) + 1))[: limit + 1]
        assert len(tokenizer(worst, add_special_tokens=False)["input_ids"]) > max_tokens


def test_a_capped_text_is_tokenised_only_up_to_the_bound(tokenizer):
    short = "12 + 7 = 19"
    assert (
        capped_token_ids(short, tokenizer, 64, False)
        == tokenizer(short, add_special_tokens=False)["input_ids"]
    )
    huge = "ab " * 1_000_000
    ids = capped_token_ids(huge, tokenizer, 16, False)
    assert 16 < len(ids) <= char_limit(tokenizer, 16)
    data = DataConfig(max_prompt_length=16, max_response_length=8, apply_chat_template=False)
    assert len(encode_prompt(huge, tokenizer, data)) > 16
    assert len(encode_response(huge, tokenizer, data)) > 8


def test_prompts_far_beyond_the_bound_are_dropped_untokenised_and_counted_per_file(
    tmp_path, tokenizer, caplog
):
    huge = [{"role": "user", "content": "ab " * 200_000}]  # 600 kB: 3 s and 300 MB to tokenise
    fine = [{"role": "user", "content": "1 + 1 ="}]
    a = write_jsonl(tmp_path / "a.jsonl", [{"data_source": "x", "prompt": p} for p in (fine, huge, huge)])
    b = write_parquet(tmp_path / "b.parquet", [{"data_source": "x", "prompt": p} for p in (huge, fine)])
    with caplog.at_level(logging.WARNING, logger="megarl.data"):
        ds = PromptDataset([a, b], tokenizer, 64)
    assert [r.where for r in ds.rows] == ["a.jsonl line 1", "b.parquet row 1"]
    assert ds.report.too_long == [
        ("a.jsonl line 2", None),
        ("a.jsonl line 3", None),
        ("b.parquet row 0", None),
    ]
    limit = char_limit(tokenizer, 64)
    assert [r.getMessage() for r in caplog.records] == [
        f"data.train_files: dropped 3 prompts longer than data.max_prompt_length=64 tokens (3 over {limit} "
        "characters, not tokenised) in a.jsonl: 2 (line 2, line 3), b.parquet: 1 (row 0); raise "
        "data.max_prompt_length to keep them"
    ]
