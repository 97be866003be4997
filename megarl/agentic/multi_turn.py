"""A multi-turn rollout: every sample a conversation with the engine, run by an agent loop.

`MultiTurnRollout.run` turns a prompt batch into one conversation per sample (`sampling.n` per prompt),
runs them all at once — the built-in loops (`megarl.agentic.loops`) as coroutines, or the user's
`openai` agents against the OpenAI endpoint (`megarl.agentic.endpoint`, backed by
`megarl.agentic.sessions`) — while this thread steps the engine (`EngineDriver.serve`), and returns each
sample's `Sample` (response tokens with their mask: 1 generated, 0 given) and the per-row agent columns:

| column          | shape   | what                                                                   |
|-----------------|---------|------------------------------------------------------------------------|
| `num_turns`     | [m] long| assistant turns                                                        |
| `tool_calls`    | [m] long| tool calls the model made                                              |
| `tool_errors`   | [m] long| of those, the ones that failed (any outcome but ok)                    |
| `turn_rewards`  | [m, R]  | each turn's score on its last generated token (environments)           |
| `agent_reward`  | [m]     | the reward an `openai` agent returned (0 when it failed)               |
| `split_index`   | [m] long| how many times the conversation was split (0: never)                   |
| `token_exact`   | [m] long| 1 when the row's tokens equal what the engine was given and produced   |
| `agent_outcomes`| [m] dict| tool outcome → count, and agent/environment errors (non-tensor)        |

A conversation split by its harness trains on its last segment (the one its reward judges); the
earlier segments are counted in `split_index`, not trained.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from megarl.agentic.chat_format import ChatFormat
from megarl.agentic.conversation import Conversation
from megarl.agentic.engine_driver import EngineDriver
from megarl.agentic.loops import LOOPS, LoopContext
from megarl.config.roles import RolloutSpec
from megarl.errors import MegarlError
from megarl.protocol import Batch, Col

ParamsFor = Callable[[int, int, list[int]], Any]  # (seed, max_tokens, stop ids) → vllm.SamplingParams


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The sampling seed of one turn of sample `sample` of a prompt whose request seed is `seed`."""
    return int(np.random.SeedSequence([seed, sample, turn]).generate_state(1, dtype=np.uint32)[0]) >> 1


class MultiTurnRollout:
    """The agent side of a `VLLMRollout` whose rollout.multi_turn.enable is set."""

    def __init__(self, llm, spec: RolloutSpec, engine_guard) -> None:
        from megarl.data.chat import load_tokenizer

        self.llm = llm
        self.guard = engine_guard
        self.multi_turn = spec.rollout.multi_turn
        self.agent = spec.rollout.agent
        self.loop_name = self.agent.default_agent_loop
        self.tokenizer = load_tokenizer(spec.model)
        self.tools = None
        if self.loop_name == "tool_agent":
            from megarl.agentic.tools import ToolSet

            self.tools = ToolSet.from_config(
                list(self.multi_turn.tools),
                self.multi_turn.tool_config_path,
                self.multi_turn.max_tool_response_length,
                self.multi_turn.tool_response_truncate_side,
                self.multi_turn.tool_timeout_s,
            )
        self.environment = None
        if self.loop_name == "env_agent":
            from megarl.agentic.environment import load_environment

            assert self.multi_turn.environment is not None
            self.environment = load_environment(self.multi_turn.environment)
        self.agent_function = None
        if self.loop_name == "openai_agent":
            from megarl.agentic.agents import load_agent_function

            assert self.agent.agent_function is not None
            self.agent_function = load_agent_function(self.agent.agent_function)
        self._formats: dict[str, ChatFormat] = {}
        # the engine's record of the last rollout: conversation segment → [(input ids, output ids)] per turn
        self.last_calls: dict[str, list[tuple[list[int], list[int]]]] = {}

    def format_for(self, tools: list[dict] | None) -> ChatFormat:
        """The chat format with `tools` in the system prompt (as the template renders them), built once."""
        key = json.dumps(tools, sort_keys=True)
        if key not in self._formats:
            self._formats[key] = ChatFormat(self.tokenizer, tools=tools or None)
        return self._formats[key]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def run(
        self,
        batch: Batch,
        n: int,
        budget: int,
        seeds: list[int],
        params_for: ParamsFor,
        log_probs: bool,
        lora_request=None,
    ) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
        """Each prompt's `n` samples (`megarl.rollout.base.Sample`'s fields) and the agent columns (see the
        module doc), rows in sample order; every turn runs with `lora_request` (None: the base model)."""
        driver = EngineDriver(self.llm, self.guard, log_probs, lora_request)
        tools = self.tools.schemas if self.tools is not None else None
        fmt = self.format_for(tools)
        stops = fmt.stop_token_ids
        rows = _rows(batch)
        convs: list[Conversation] = []
        for i, row in enumerate(rows):
            for j in range(n):

                def params(turn: int, cap: int, seed=seeds[i], j=j) -> Any:
                    return params_for(turn_seed(seed, j, turn), cap, stops)

                convs.append(Conversation(f"{i}.{j}", row, driver, params, budget))
        done, failures = threading.Event(), []

        def agents() -> None:
            try:
                if self.agent_function is not None:
                    self._run_openai_agents(convs)
                else:
                    asyncio.run(self._run_loops(convs, fmt))
            except BaseException as e:
                failures.append(e)
            finally:
                done.set()

        thread = threading.Thread(target=agents, name="megarl-agents", daemon=True)
        thread.start()
        driver.serve(done)
        thread.join()
        self.last_calls = driver.calls
        if failures:
            e = failures[0]
            raise MegarlError(f"the multi-turn rollout failed: {type(e).__name__}: {e}") from e
        return _samples(convs, n, log_probs), _columns(convs, driver, budget)

    async def _run_loops(self, convs: list[Conversation], fmt: ChatFormat) -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(self.agent.num_workers))
        ctx = LoopContext(fmt, self.decode, self.multi_turn, self.tools, self.environment)
        loop = LOOPS[self.loop_name]
        for conv in convs:
            conv.start(fmt.prompt_ids(list(conv.sample["raw_prompt"])))
        await asyncio.gather(*(loop(conv, ctx) for conv in convs))

    def _run_openai_agents(self, convs: list[Conversation]) -> None:
        from megarl.agentic.agents import run_agents
        from megarl.agentic.endpoint import OpenAIServer
        from megarl.agentic.sessions import SessionBackend

        assert self.agent_function is not None
        by_session = {conv.key: conv for conv in convs}
        backend = SessionBackend(
            by_session, self.format_for, self.decode, self.encode, self.multi_turn.max_assistant_turns
        )
        with OpenAIServer(backend) as server:
            outcomes = run_agents(
                self.agent_function,
                [dict(conv.sample) for conv in convs],
                server.base_url,
                list(by_session),
                self.agent.num_workers,
                self.agent.timeout_s,
            )
        for conv, outcome in zip(convs, outcomes):
            conv.agent_reward = outcome.reward
            conv.error = outcome.error
            if conv.traj is None:  # the agent never asked: an empty response
                conv.start(self.format_for(None).prompt_ids(list(conv.sample["raw_prompt"])))
                conv.error = conv.error or "the agent made no request"


def _rows(batch: Batch) -> list[dict[str, Any]]:
    """Each prompt row's non-tensor columns (raw_prompt, ground_truth, extra_info, …) as a dict."""
    if "raw_prompt" not in batch.non_tensors:
        raise MegarlError("a multi-turn rollout needs the prompts' raw_prompt column (the chat messages)")
    names = list(batch.non_tensors)
    return [{k: _plain(batch.non_tensors[k][i]) for k in names} for i in range(len(batch))]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _samples(convs: list[Conversation], n: int, log_probs: bool) -> list[list[dict[str, Any]]]:
    samples = []
    for conv in convs:
        traj = conv.traj
        assert traj is not None
        samples.append(
            dict(
                token_ids=list(traj.ids),
                log_probs=list(traj.log_probs) if log_probs else None,
                finish_reason=conv.finish_reason,
                mask=list(traj.mask),
                prompt_ids=list(traj.prompt_ids),
            )
        )
    return [samples[i : i + n] for i in range(0, len(samples), n)]


def _columns(convs: list[Conversation], driver: EngineDriver, budget: int) -> dict[str, Any]:
    m = len(convs)
    turn_rewards = torch.zeros(m, budget, dtype=torch.float32)
    exact = torch.zeros(m, dtype=torch.long)
    outcomes = []
    for row, conv in enumerate(convs):
        traj = conv.traj
        assert traj is not None
        for end, score in zip(traj.turn_ends, traj.turn_scores):
            turn_rewards[row, end] += score
        exact[row] = int(traj.check_exact(driver.calls.get(conv.segment_key, [])))
        counts = dict(conv.outcomes)
        if conv.error is not None:
            counts["agent_error"] = counts.get("agent_error", 0) + 1
        outcomes.append(counts)
    return {
        "num_turns": torch.tensor([c.turns for c in convs], dtype=torch.long),
        "tool_calls": torch.tensor([c.tool_calls for c in convs], dtype=torch.long),
        "tool_errors": torch.tensor(
            [sum(v for k, v in c.outcomes.items() if k != "ok") for c in convs], dtype=torch.long
        ),
        Col.TURN_REWARDS: turn_rewards,
        "agent_reward": torch.tensor([c.agent_reward or 0.0 for c in convs], dtype=torch.float32),
        "split_index": torch.tensor([len(c.segments) for c in convs], dtype=torch.long),
        "token_exact": exact,
        "agent_outcomes": outcomes,
    }
