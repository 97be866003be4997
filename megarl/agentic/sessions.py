"""The OpenAI endpoint's backend: each session is one conversation, kept in token space.

A harness sends the whole chat every time. The backend compares it with what the session has seen (its
earlier requests and the replies it gave): when the new chat extends that by tool or user messages only,
just those are appended as tokens (`ChatFormat.append_ids`), exactly as the built-in loops append them;
otherwise (the harness dropped the reasoning of an earlier turn, compacted the context, edited a message)
the chat is rendered afresh and, when its tokens do not extend the trajectory, the trajectory is split
(`Conversation.restart_from`). Sampling follows rollout.*; a request's max_tokens can only lower the cap.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from megarl.agentic.chat_format import ChatFormat
from megarl.agentic.conversation import Conversation
from megarl.agentic.endpoint import Reply
from megarl.agentic.tools import parse_hermes
from megarl.errors import MegarlError


def _normal(message: dict) -> tuple:
    """A message as compared between requests: role, text, and tool calls by name and arguments."""
    calls = tuple(
        (c.get("function", c).get("name"), json.dumps(c.get("function", c).get("arguments"), sort_keys=True))
        for c in message.get("tool_calls") or ()
    )
    return message.get("role"), (message.get("content") or "").strip(), calls


class SessionBackend:
    """`megarl.agentic.endpoint.ChatBackend` over the rollout's conversations, by session id."""

    def __init__(
        self,
        conversations: dict[str, Conversation],
        format_for: Callable[[list[dict] | None], ChatFormat],
        decode: Callable[[list[int]], str],
        encode: Callable[[str], list[int]],
        max_assistant_turns: int | None,
    ) -> None:
        self.encode = encode
        self.conversations = conversations
        self.format_for = format_for
        self.decode = decode
        self.max_assistant_turns = max_assistant_turns

    def _conversation(self, session: str) -> Conversation:
        conv = self.conversations.get(session)
        if conv is None:
            raise MegarlError(f"unknown session {session!r}: use the client megarl gives each agent")
        return conv

    def chat(
        self, session: str, messages: list[dict], tools: list[dict] | None, max_tokens: int | None
    ) -> Reply:
        conv = self._conversation(session)
        fmt = self.format_for(tools)
        with conv.lock:
            if conv.traj is None:
                conv.start(fmt.prompt_ids(messages))
            else:
                seen = [_normal(m) for m in conv.seen]
                new = messages[len(conv.seen) :]
                extends = [_normal(m) for m in messages[: len(conv.seen)]] == seen
                if extends and new and all(m.get("role") in ("tool", "user") for m in new):
                    if not conv.append(new, fmt):
                        return self._out_of_room(conv)
                else:  # not an extension in messages: render it; a split unless its tokens extend
                    conv.restart_from(fmt.prompt_ids(messages))
            if self.max_assistant_turns is not None and conv.turns >= self.max_assistant_turns:
                return self._out_of_room(conv)
            if conv.room <= 0:
                return self._out_of_room(conv)
            turn = conv.generate_blocking(max_tokens)
            text = self.decode(turn.ids)
            parsed = parse_hermes(text)
            conv.tool_calls += len(parsed.calls) + len(parsed.malformed)  # as the tool loop counts them
            conv.outcomes.update({"malformed": len(parsed.malformed)} if parsed.malformed else {})
            reply_message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            if parsed.calls:
                reply_message["tool_calls"] = [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in parsed.calls
                ]
            conv.seen = [*messages, reply_message]
            finish = "tool_calls" if parsed.calls and turn.finish_reason == "stop" else turn.finish_reason
            return Reply(
                content=parsed.content or None,
                tool_calls=list(parsed.calls),
                finish_reason=finish,
                prompt_tokens=len(conv.traj.context) - len(turn.ids) if conv.traj else 0,
                completion_tokens=len(turn.ids),
                text=text,
            )

    def complete(self, session: str, prompt: str | list[int], max_tokens: int | None) -> Reply:
        """A raw prompt: token ids are used as they are; a string is tokenised (no special tokens added),
        which re-tokenises earlier turns' text — where that gives other ids than the engine produced, the
        trajectory splits. Send the ids (`prompt=[...]`) to stay exact."""
        conv = self._conversation(session)
        ids = list(prompt) if isinstance(prompt, list) else self.encode(prompt)
        with conv.lock:
            if conv.traj is None:
                conv.start(ids)
            else:
                conv.restart_from(ids)
            if conv.room <= 0 or (
                self.max_assistant_turns is not None and conv.turns >= self.max_assistant_turns
            ):
                return self._out_of_room(conv)
            turn = conv.generate_blocking(max_tokens)
            text = self.decode(turn.ids)
            return Reply(
                content=text,
                tool_calls=[],
                finish_reason=turn.finish_reason,
                prompt_tokens=len(ids),
                completion_tokens=len(turn.ids),
                text=text,
            )

    @staticmethod
    def _out_of_room(conv: Conversation) -> Reply:
        conv.finish_reason = "length"
        return Reply(
            content=None, tool_calls=[], finish_reason="length", prompt_tokens=0, completion_tokens=0, text=""
        )
