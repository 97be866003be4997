"""The tool loop end to end in one process: `MultiTurnRollout.run` with megarl's tools, on an engine that
plays a scripted model (the fault injected: tool calls that are malformed, name an unknown tool, or hit a
tool that raises, hangs, returns a dict or returns 10 000 characters). The rollout completes, counts
each outcome, and every row is the engine's tokens with the given ones masked."""

from __future__ import annotations

import contextlib
import json
import time
from itertools import count
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from megarl.agentic.chat_format import ChatFormat
from megarl.agentic.metrics import agent_metrics
from megarl.agentic.multi_turn import MultiTurnRollout
from megarl.config.roles import rollout_spec
from megarl.config.schema import MegarlConfig
from megarl.protocol import Batch
from megarl.rollout.base import Sample, rollout_batch

FAULTY = f"{Path(__file__).resolve().parents[2] / 'helpers' / 'faulty_tools.py'}:calculator"
PROMPT, RESPONSE = 32, 400


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# what the scripted model says first, per prompt; after any tool result it answers
FIRST_TURNS = [
    "<tool_call>\n{not json\n</tool_call>",  # malformed
    call("weather", city="Paris"),  # unknown tool
    *[call("calculator", expression="3 * 4")] * 5,  # the faulty calculator, once per failure
    "answer: 12",  # no tool at all
]


class ScriptedEngine:
    """vLLM's engine surface as the driver uses it, answering by script (turn 1 from FIRST_TURNS by
    prompt, then "answer: 12"), a step at a time, with a log-prob per token."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.requests, self.request_counter = tokenizer, {}, count()
        self.llm_engine = self

    def add_request(self, request_id, prompt, params, lora_request=None) -> None:
        ids = prompt["prompt_token_ids"]
        question = next(i for i, t in enumerate(FIRST_TURNS) if f"question {i}" in self.tokenizer.decode(ids))
        first = self.tokenizer.decode(ids).count("<|im_start|>assistant") == 1
        text = FIRST_TURNS[question] if first else "answer: 12"
        out = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        reason = "stop"
        if len(out) > params.max_tokens:
            out, reason = out[: params.max_tokens], "length"
        self.requests[request_id] = (out, reason)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self):
        time.sleep(0.001)
        done, self.requests = self.requests, {}
        return [
            SimpleNamespace(
                request_id=rid,
                finished=True,
                outputs=[
                    SimpleNamespace(
                        token_ids=ids,
                        finish_reason=reason,
                        logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in ids],
                    )
                ],
            )
            for rid, (ids, reason) in done.items()
        ]

    def abort_request(self, ids) -> None:
        for rid in ids:
            self.requests.pop(rid, None)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from megarl.models.tiny import build_tokenizer

    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(1001).save_pretrained(path)
    return path


def spec(tokenizer_dir, **multi_turn):
    cfg = MegarlConfig()
    cfg.model.path = cfg.model.tokenizer_path = str(tokenizer_dir)
    cfg.data.max_prompt_length, cfg.data.max_response_length = PROMPT, RESPONSE
    cfg.rollout.multi_turn.enable = True
    cfg.rollout.multi_turn.tools = [FAULTY]
    cfg.rollout.multi_turn.tool_timeout_s = 0.5
    cfg.rollout.multi_turn.max_tool_response_length = 64
    cfg.rollout.multi_turn.max_assistant_turns = 3
    for key, value in multi_turn.items():
        setattr(cfg.rollout.multi_turn, key, value)
    cfg.rollout.agent.default_agent_loop = "tool_agent"
    return rollout_spec(cfg)


def prompts(tokenizer) -> Batch:
    raw = [[{"role": "user", "content": f"question {i}"}] for i in range(len(FIRST_TURNS))]
    ids = [ChatFormat(tokenizer).prompt_ids(m) for m in raw]
    p = torch.zeros(len(raw), PROMPT, dtype=torch.long)
    mask = torch.zeros_like(p)
    for i, row in enumerate(ids):
        p[i, PROMPT - len(row) :], mask[i, PROMPT - len(row) :] = torch.tensor(row), 1
    return Batch({"prompts": p, "attention_mask": mask}, {"raw_prompt": raw})


@pytest.fixture(scope="module")
def rollout(tokenizer_dir):
    from megarl.data.chat import load_tokenizer

    s = spec(tokenizer_dir)
    tokenizer = load_tokenizer(s.model)
    multi = MultiTurnRollout(ScriptedEngine(tokenizer), s, contextlib.nullcontext)
    batch = prompts(tokenizer)

    def params(seed, cap, stops):
        return SimpleNamespace(max_tokens=cap, seed=seed, stop_token_ids=stops, output_kind=None)

    t0 = time.perf_counter()
    fields, columns = multi.run(batch, 1, RESPONSE, list(range(len(batch))), params, True)
    seconds = time.perf_counter() - t0
    out = rollout_batch(
        batch, [[Sample(**f) for f in row] for row in fields], RESPONSE, tokenizer.pad_token_id
    )
    for k, v in columns.items():
        out[k] = v
    return SimpleNamespace(out=out, calls=multi.last_calls, tokenizer=tokenizer, seconds=seconds)


def test_every_bad_outcome_is_counted_and_the_rollout_completes(rollout):
    metrics = agent_metrics(rollout.out)
    for outcome in ("raised", "timeout", "non_text", "truncated", "malformed", "unknown_tool"):
        assert metrics[f"agent/tool_errors/{outcome}"] == 1.0, (outcome, metrics)
    assert metrics["agent/tool_errors/total"] == 6.0
    assert rollout.out["tool_calls"].tolist() == [1, 1, 1, 1, 1, 1, 1, 0]
    assert rollout.out["num_turns"].tolist() == [2] * 7 + [1]
    assert rollout.seconds < 10  # the hung tool was abandoned at its timeout, not awaited


def test_the_model_reads_an_error_message_for_each_failure(rollout):
    given = []
    for row in range(len(rollout.out)):
        r = rollout.out["responses"][row]
        picked = (rollout.out["response_mask"][row] == 0) & (rollout.out["attention_mask"][row, PROMPT:] == 1)
        given.append(rollout.tokenizer.decode(r[picked]))
    assert "error" in given[0].lower() and "weather" in given[1]
    assert sum("12" in g and "error" not in g.lower() for g in given[2:7]) == 1  # the one right call
    assert any(len(g) > 64 and "7777" in g for g in given[2:7])  # cut to 64 characters, plus the marker
    assert given[7] == ""


def test_rows_are_the_engines_tokens_with_given_tokens_masked(rollout):
    out = rollout.out
    assert out["token_exact"].tolist() == [1] * len(out)
    for row in range(len(out)):
        record = rollout.calls[f"{row}.0/0"]
        prompt = out["prompts"][row][out["attention_mask"][row, :PROMPT].bool()].tolist()
        length = int(out["attention_mask"][row, PROMPT:].sum())
        tokens = prompt + out["responses"][row, :length].tolist()
        assert record[-1][0] + record[-1][1] == tokens
        generated = out["response_mask"][row, :length].bool()
        assert [t for t, g in zip(out["responses"][row, :length].tolist(), generated) if g] == [
            t for _, produced in record for t in produced
        ]
        log_probs = out["rollout_log_probs"][row, :length]
        assert (log_probs[generated] == -0.5).all() and (log_probs[~generated] == 0).all()
