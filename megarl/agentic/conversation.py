"""One sample's conversation with the engine, in token space.

A `Conversation` owns the sample's `Trajectory` (prompt, then generated and given tokens with their
mask), asks the engine for each assistant turn within the response budget, appends the tokens of the
messages that answer it (`ChatFormat.append_ids`: the template's turn boundary, the messages, the next
assistant header) and counts what the run reports: turns, tool calls and their outcomes, splits.
Nothing already in the trajectory is ever re-tokenised. When a caller hands over a whole conversation
that does not extend the tokens so far (an agent harness that rewrote history: dropped reasoning, a
compacted context), the trajectory is split: a new one starts from that conversation's tokens and the
split is counted.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from megarl.agentic.chat_format import ChatFormat
from megarl.agentic.engine_driver import EngineDriver, EngineTurn
from megarl.agentic.trajectory import Trajectory


@dataclass
class Conversation:
    """`key` names it in the engine's call record; `sample` is the dataset row (raw_prompt, ground_truth,
    extra_info, …); `params(turn, max_tokens)` gives the turn's seeded `vllm.SamplingParams`; `budget`
    is the response length (generated and given tokens together)."""

    key: str
    sample: dict[str, Any]
    driver: EngineDriver
    params: Callable[[int, int], Any]
    budget: int
    traj: Trajectory | None = None
    segments: list[Trajectory] = field(default_factory=list)  # the earlier trajectories, split off
    turns: int = 0  # assistant turns generated, over every segment
    user_turns: int = 0
    outcomes: Counter = field(default_factory=Counter)  # tool outcome → count
    tool_calls: int = 0
    agent_reward: float | None = None
    error: str | None = None  # why the agent or environment stopped early (counted, not raised)
    finish_reason: str = "stop"
    last_token: int | None = None  # the last generated token (the stop token of a finished turn)
    seen: list[dict] = field(default_factory=list)  # the endpoint's messages so far (with its replies)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def segment_key(self) -> str:
        return f"{self.key}/{len(self.segments)}"

    def start(self, prompt_ids: list[int]) -> None:
        self.traj = Trajectory(prompt_ids=list(prompt_ids))

    @property
    def room(self) -> int:
        """Response tokens left in the budget."""
        assert self.traj is not None
        return self.budget - len(self.traj.ids)

    def _submit(self, max_tokens: int | None):
        assert self.traj is not None, "start the conversation first"
        cap = self.room if max_tokens is None else min(max_tokens, self.room)
        params = self.params(self.turns, cap)
        return self.driver.submit(self.segment_key, self.traj.context, params)

    def _took(self, turn: EngineTurn) -> EngineTurn:
        assert self.traj is not None
        self.turns += 1
        self.traj.add_generated(turn.ids, turn.log_probs)
        self.last_token = turn.ids[-1] if turn.ids else None
        self.finish_reason = turn.finish_reason
        return turn

    def generate_blocking(self, max_tokens: int | None = None) -> EngineTurn:
        """The next assistant turn (from a handler thread)."""
        return self._took(self._submit(max_tokens).result())

    async def generate(self, max_tokens: int | None = None) -> EngineTurn:
        """The next assistant turn (from an agent coroutine)."""
        return self._took(await asyncio.wrap_future(self._submit(max_tokens)))

    def append(self, messages: list[dict], fmt: ChatFormat) -> bool:
        """Append `messages` (tool results, a user turn) after the last assistant turn and open the next
        one. False, appending nothing, when they would not leave a token to generate: the conversation
        ends at the budget (finish_reason "length")."""
        assert self.traj is not None
        ids = fmt.append_ids(messages, after_stop=self.last_token if self.finish_reason == "stop" else None)
        if len(ids) >= self.room:
            self.finish_reason = "length"
            return False
        self.traj.add_given(ids)
        return True

    def restart_from(self, full_ids: list[int]) -> bool:
        """The caller's whole next input: appended as given tokens when it extends the trajectory, else a
        split (returns True): the trajectory so far is kept as a segment and a new one starts. A new one
        that begins with this conversation's first prompt keeps it as its prompt and takes the rest as
        given response tokens, so it fits the batch's prompt width."""
        assert self.traj is not None
        new = self.traj.extend_or_split(full_ids)
        if new is None:
            return False
        self.segments.append(self.traj)
        first = self.segments[0].prompt_ids
        if full_ids[: len(first)] == first:
            self.traj = Trajectory(prompt_ids=list(first))
            self.traj.add_given(full_ids[len(first) :])
        else:
            self.traj = new
        self.last_token = None
        return True

    def score_turn(self, score: float) -> None:
        """A turn-level reward for the last assistant turn (`turn_scores`, placed on its last token)."""
        assert self.traj is not None and self.traj.turn_scores, "score a turn after generating it"
        self.traj.turn_scores[-1] = float(score)

    def count(self, results) -> None:
        """Count tool results (`megarl.agentic.tools.ToolResult`)."""
        self.tool_calls += len(results)
        self.outcomes.update(r.outcome.value for r in results)
