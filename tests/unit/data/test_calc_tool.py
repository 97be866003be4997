"""megarl data make calc_tool: RL prompts in verl's schema, multi-turn SFT traces that call the calculator in
the Hermes format, lengths under the tiny tokenizer that fit configs/agentic_grpo.yaml, and its reward."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from megarl.cli import main
from megarl.config import load_config
from megarl.config.schema import DataConfig, SFTMultiturnConfig
from megarl.data.datasets import PromptDataset
from megarl.data.sft import load_sft_examples
from megarl.data.tasks import make_task
from megarl.rewards import default_compute_score

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
CALL = re.compile(r"\A<tool_call>\n(.*)\n</tool_call>\Z", re.S)


def exact(expression: str) -> int:
    a, op, b = expression.split()
    assert op in "*+" and a.isdigit() and b.isdigit()
    return int(a) * int(b) if op == "*" else int(a) + int(b)


def test_files_hold_right_answers_and_hermes_calls_with_the_exact_expression(tmp_path):
    files = make_task("calc_tool", tmp_path, n_train=300, n_val=50, n_sft=400, seed=3)
    assert files.preference is None and files.kto is None
    train, val = pq.read_table(files.train).to_pylist(), pq.read_table(files.val).to_pylist()
    sft = pq.read_table(files.sft).to_pylist()
    assert (len(train), len(val), len(sft)) == (300, 50, 400)
    assert set(train[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    for r in train + val:
        (message,) = r["prompt"]
        assert r["data_source"] == "calc_tool" and message["role"] == "user"
        assert r["reward_model"]["ground_truth"] == str(exact(message["content"].removesuffix(" =")))
    assert {r["prompt"][0]["content"] for r in val}.isdisjoint(r["prompt"][0]["content"] for r in train)
    assert {r["prompt"][0]["content"] for r in val}.isdisjoint(r["messages"][0]["content"] for r in sft)
    assert sum(r["uses_tool"] for r in sft) == 200  # --tool-share 0.5
    shapes = {"*": 0, "+": 0}
    for r in sft:
        m = r["messages"]
        expression = m[0]["content"].removesuffix(" =")
        shapes[expression.split()[1]] += 1
        answer = str(exact(expression))
        assert m[-1] == {"role": "assistant", "content": f"answer: {answer}"}
        if not r["uses_tool"]:
            assert [x["role"] for x in m] == ["user", "assistant"]
            continue
        assert [x["role"] for x in m] == ["user", "assistant", "tool", "assistant"]
        call = json.loads(CALL.match(m[1]["content"]).group(1))
        assert call == {"name": "calculator", "arguments": {"expression": expression}}
        assert m[2]["content"] == answer
    assert min(shapes.values()) > 150  # both kinds of problem


def test_same_seed_same_files_other_seed_or_share_differs(tmp_path):
    a = make_task("calc_tool", tmp_path / "a", n_train=40, n_val=10, n_sft=20, seed=1)
    b = make_task("calc_tool", tmp_path / "b", n_train=40, n_val=10, n_sft=20, seed=1)
    c = make_task("calc_tool", tmp_path / "c", n_train=40, n_val=10, n_sft=20, seed=2)
    for split in ("train", "val", "sft"):
        assert pq.read_table(getattr(a, split)).equals(pq.read_table(getattr(b, split)))
    assert not pq.read_table(a.train).equals(pq.read_table(c.train))
    every = make_task("calc_tool", tmp_path / "d", n_train=4, n_val=4, n_sft=20, seed=1, tool_share=1.0)
    assert all(r["uses_tool"] for r in pq.read_table(every.sft).to_pylist())
    with pytest.raises(ValueError, match="tool_share is a setting of calc_tool, not of 'digits_sort'"):
        make_task("digits_sort", tmp_path / "e", tool_share=0.5)


def test_traces_fit_the_agentic_configs_lengths_under_the_tiny_tokenizer(tmp_path, tokenizer):
    cfg = load_config(str(REPO / "configs" / "agentic_grpo.yaml"), [], check_paths=False)
    files = make_task("calc_tool", tmp_path, n_train=8, n_val=8, n_sft=200, seed=0, tool_share=1.0)
    ids = lambda messages, gen: tokenizer.apply_chat_template(  # noqa: E731
        messages, add_generation_prompt=gen, return_dict=True
    )["input_ids"]
    for r in pq.read_table(files.sft).to_pylist():
        prompt, whole = ids(r["messages"][:1], True), ids(r["messages"], False)
        assert len(prompt) <= cfg.data.max_prompt_length
        assert len(whole) - len(prompt) <= cfg.data.max_response_length  # calls, result and answer
    ds = PromptDataset([str(files.train), str(files.val)], tokenizer, cfg.data.max_prompt_length)
    assert len(ds) == 16 and ds.report.too_long == [] and not ds.report.malformed
    # every assistant turn is an SFT example (data.multiturn.enable), none dropped for length
    data = DataConfig(
        max_prompt_length=160, max_response_length=96, multiturn=SFTMultiturnConfig(enable=True)
    )
    assert len(load_sft_examples([str(files.sft)], tokenizer, data, "data.train_files")) == 400


def test_reward_reads_the_last_answer_and_never_the_tool_output():
    score = lambda text: default_compute_score("calc_tool", text, "29842")  # noqa: E731
    assert score("answer: 29842") == 1.0
    assert score('<tool_call>\n{"name": "calculator"}\n</tool_call>\ntool\n29842\nanswer: 29842') == 1.0
    assert score("tool\n29842\n") == 0.0  # the tool's result alone
    assert score("answer: 29842 ... answer: 29843") == 0.0  # the last answer counts
    assert score("answer: 1 answer:29842") == 1.0
    assert score("answer: 298420") == 0.0 and score("") == 0.0


def test_cli_writes_the_three_files(tmp_path, capsys):
    assert (
        main(
            [
                "data",
                "make",
                "calc_tool",
                "--out",
                str(tmp_path),
                "--n-train",
                "4",
                "--n-val",
                "2",
                "--n-sft",
                "4",
                "--tool-share",
                "0.25",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out.split("\n")
    assert [line.split()[0] for line in printed if line] == ["train", "val", "sft"]
    assert sum(r["uses_tool"] for r in pq.read_table(tmp_path / "sft.parquet").to_pylist()) == 1
