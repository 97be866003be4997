"""One in-process vLLM engine serving many multi-turn conversations at once.

Agents (the built-in tool and environment loops, the OpenAI endpoint's handlers, a user's `openai`
agent) run in other threads and `submit` one turn at a time: the conversation's token ids so far and
the turn's sampling parameters. The engine thread runs `serve`, which adds each submitted turn to the
engine as it arrives and steps the engine while anything is in flight: turns of different conversations
are batched together whatever turn each is at (continuous batching across turns), and a conversation
whose tool is running takes no engine slot. Every turn's input and output ids are kept per conversation
(`calls`), so the trained tokens can be compared with what the engine was given and produced.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from megarl.errors import MegarlError

# How long the engine thread waits for a new turn when nothing is in flight before it checks whether
# the agents are done.
_IDLE_POLL_S = 0.02


@dataclass(frozen=True)
class EngineTurn:
    """What the engine produced for one turn."""

    ids: list[int]
    log_probs: list[float] | None
    finish_reason: str  # "stop" (a stop token) or "length" (the turn's max_tokens)


@dataclass
class _Pending:
    future: Future
    conversation: str
    prompt: list[int]


class EngineDriver:
    """Steps `llm` (a `vllm.LLM`) in the thread that calls `serve`; `submit` is thread-safe. Every engine
    call runs under `engine_guard()` (RNG, threads, CPU shims: `megarl.rollout.colocate.engine_call`);
    every turn carries `lora_request` (the policy's adapter, `megarl.rollout.vllm_lora`; None: the base)."""

    def __init__(
        self,
        llm,
        engine_guard: Callable[[], AbstractContextManager] = contextlib.nullcontext,
        log_probs: bool = False,
        lora_request=None,
    ) -> None:
        self.llm = llm
        self.guard = engine_guard
        self.log_probs = log_probs
        self.lora_request = lora_request
        self._inbox: queue.Queue[tuple[list[int], Any, str, Future]] = queue.Queue()
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        # conversation → [(input ids, output ids)] per turn, in order: the comparator's engine-side record
        self.calls: dict[str, list[tuple[list[int], list[int]]]] = {}

    def submit(self, conversation: str, prompt_ids: list[int], params) -> Future:
        """Queue one turn of `conversation` (its ids so far; `params` a `vllm.SamplingParams` with n=1);
        the future gives an `EngineTurn`."""
        future: Future = Future()
        self._inbox.put((list(prompt_ids), params, conversation, future))
        return future

    def serve(self, done: threading.Event) -> None:
        """Run turns until `done` is set and nothing is queued or in flight. A failure inside the engine
        fails every waiting turn (so no agent waits forever) and is raised here."""
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        if engine.has_unfinished_requests():
            raise MegarlError(
                "the vLLM engine still has unfinished requests from an earlier call; a multi-turn rollout "
                "needs an idle engine"
            )
        try:
            while True:
                busy = engine.has_unfinished_requests()
                self._admit(block=not busy, output_kind=RequestOutputKind.FINAL_ONLY)
                if engine.has_unfinished_requests():
                    with self.guard():
                        outputs = engine.step()
                    for out in outputs:
                        if out.finished:
                            self._finish(out)
                elif done.is_set() and self._inbox.empty():
                    return
        except BaseException as e:
            with self.guard():
                if self._pending:
                    engine.abort_request(list(self._pending))
            for pending in self._pending.values():
                pending.future.set_exception(MegarlError(f"the engine failed: {type(e).__name__}: {e}"))
            self._pending.clear()
            self._fail_queued(e)
            raise

    def _admit(self, block: bool, output_kind) -> None:
        try:
            item = self._inbox.get(timeout=_IDLE_POLL_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            prompt, params, conversation, future = item
            params.output_kind = output_kind
            request_id = str(next(self.llm.request_counter))
            self._pending[request_id] = _Pending(future, conversation, prompt)
            with self.guard():
                self.llm.llm_engine.add_request(
                    request_id, {"prompt_token_ids": prompt}, params, lora_request=self.lora_request
                )
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _finish(self, out) -> None:
        pending = self._pending.pop(out.request_id)
        (c,) = out.outputs
        ids = list(c.token_ids)
        log_probs = [lp[t].logprob for lp, t in zip(c.logprobs, ids)] if self.log_probs else None
        with self._lock:
            self.calls.setdefault(pending.conversation, []).append((pending.prompt, ids))
        pending.future.set_result(EngineTurn(ids, log_probs, c.finish_reason or "length"))

    def _fail_queued(self, error: BaseException) -> None:
        while True:
            try:
                *_, future = self._inbox.get_nowait()
            except queue.Empty:
                return
            future.set_exception(MegarlError(f"the engine failed: {type(error).__name__}: {error}"))
