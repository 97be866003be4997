"""The built-in agent loops (`rollout.agent.default_agent_loop`), one coroutine per conversation.

| loop                | what a conversation does                                                        |
|---------------------|---------------------------------------------------------------------------------|
| `single_turn_agent` | one assistant turn (verl's name; multi_turn.enable with no tools)               |
| `tool_agent`        | assistant turn → its Hermes tool calls run → their results appended as `tool`   |
|                     | messages → next turn, until a turn calls no tool or a limit is reached (verl's) |
| `env_agent`         | assistant turn → `environment.step(text)` → (observation, reward, done): the    |
|                     | reward scores the turn, the observation is appended as the next `user` message  |

A malformed tool call (bad JSON, no name) is answered with an error message like any failed call: the
model reads it and the run counts it. A turn that stops on the response budget ends the conversation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from megarl.agentic.chat_format import ChatFormat
from megarl.agentic.conversation import Conversation
from megarl.agentic.tools import ToolSet, parse_hermes
from megarl.config.schema_agentic import MultiTurnConfig


@dataclass
class LoopContext:
    """What every conversation of a rollout shares."""

    fmt: ChatFormat
    decode: Callable[[list[int]], str]
    multi_turn: MultiTurnConfig
    tools: ToolSet | None = None
    environment: Callable[[], Any] | None = None  # the environment class

    def turns_left(self, conv: Conversation) -> bool:
        limit = self.multi_turn.max_assistant_turns
        return limit is None or conv.turns < limit

    def user_turns_left(self, conv: Conversation) -> bool:
        limit = self.multi_turn.max_user_turns
        return limit is None or conv.user_turns < limit


async def single_turn_agent(conv: Conversation, ctx: LoopContext) -> None:
    await conv.generate()


async def tool_agent(conv: Conversation, ctx: LoopContext) -> None:
    assert ctx.tools is not None
    while ctx.turns_left(conv):
        turn = await conv.generate()
        if turn.finish_reason != "stop":
            return
        parsed = parse_hermes(ctx.decode(turn.ids))
        if not parsed.calls and not parsed.malformed:
            return  # the final answer
        if not ctx.turns_left(conv):
            return  # no turn left to read the results in
        calls = parsed.calls[: ctx.multi_turn.max_parallel_calls]
        results = [ctx.tools.malformed(reason) for reason in parsed.malformed]
        results += await asyncio.to_thread(
            ctx.tools.call_many, calls, len(calls) or 1, ctx.multi_turn.tool_timeout_s
        )
        conv.count(results)
        messages = [{"role": "tool", "name": r.name, "content": r.text} for r in results]
        if not conv.append(messages, ctx.fmt):
            return


async def env_agent(conv: Conversation, ctx: LoopContext) -> None:
    assert ctx.environment is not None
    try:
        env = ctx.environment()
        await asyncio.to_thread(env.reset, conv.sample)
    except Exception as e:  # a user class: counted, the conversation ends
        conv.error = f"environment reset: {type(e).__name__}: {e}"
        return
    while ctx.turns_left(conv):
        turn = await conv.generate()
        try:
            observation, reward, done = await asyncio.to_thread(env.step, ctx.decode(turn.ids))
            conv.score_turn(float(reward))
        except Exception as e:
            conv.error = f"environment step: {type(e).__name__}: {e}"
            return
        if done or turn.finish_reason != "stop" or not ctx.turns_left(conv) or not ctx.user_turns_left(conv):
            return
        if not conv.append([{"role": "user", "content": str(observation)}], ctx.fmt):
            return
        conv.user_turns += 1


LOOPS: dict[str, Callable[[Conversation, LoopContext], Awaitable[None]]] = {
    "single_turn_agent": single_turn_agent,
    "tool_agent": tool_agent,
    "env_agent": env_agent,
}
