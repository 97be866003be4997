"""User agents (`rollout.agent.agent_function`): `async def agent(client, sample) -> reward`, where
`client` is an `openai.AsyncOpenAI` bound to megarl's endpoint and to one trajectory, `sample` the
dataset row, and the reward a number. Loading and checking the function, and running a batch of them."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import ssl
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from megarl.agentic.endpoint import SESSION_HEADER
from megarl.errors import EXIT_USAGE, MegarlError
from megarl.user_files import import_file

KEY = "rollout.agent.agent_function"
SIGNATURE = "async def agent(client, sample) -> float"


class AgentFunctionError(MegarlError, ValueError):
    """`rollout.agent.agent_function` cannot be used; the message names the file and the fix."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class AgentOutcome:
    reward: float | None  # None when the agent failed
    error: str | None  # the exception's type and message (and the agent file's line), or the bad return


def _import(spec: str) -> tuple[Any, str]:
    """The module of `spec`'s left part, and how to name it in messages."""
    where, _, _ = spec.rpartition(":")
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise AgentFunctionError(f"{KEY}={spec}: {path} does not exist; point it at a .py file")
        try:
            module = import_file(path, "megarl_agent_")
        except (Exception, SystemExit) as e:
            raise AgentFunctionError(
                f"{KEY}={spec}: importing {path} failed: {type(e).__name__}: {e}; fix the file (it must only "
                "define functions at import)"
            ) from None
        if module is None:
            raise AgentFunctionError(f"{KEY}={spec}: {path} is not a Python file; point it at a .py file")
        return module, path
    try:
        return importlib.import_module(where), f"module {where}"
    except ImportError as e:
        raise AgentFunctionError(
            f"{KEY}={spec}: cannot import module {where!r} ({e}); give a module on the Python path or a "
            "file path, e.g. path/to/agent.py:agent"
        ) from None
    except Exception as e:
        raise AgentFunctionError(
            f"{KEY}={spec}: importing module {where} failed: {type(e).__name__}: {e}; fix the module"
        ) from None


def _problem(fn: Any, spec: str, name: str, where: str) -> str | None:
    if fn is None:
        return f"{KEY}={spec}: {where} does not define {name!r}; define `{SIGNATURE}` in it"
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)):
        kind = "a function but not async" if inspect.isfunction(fn) else f"a {type(fn).__name__}"
        return f"{KEY}={spec}: {name} in {where} is {kind}; define it as `{SIGNATURE}`"
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        return (
            f"{KEY}={spec}: {name}{inspect.signature(fn)} in {where} cannot be called as agent(client, "
            f"sample); define it as `{SIGNATURE}`"
        )
    except ValueError:  # no signature to read (a builtin): let the call tell
        pass
    return None


def load_agent_function(spec: str) -> Callable[..., Any]:
    """The agent named by `spec`: "path/to/file.py:agent" (a file, imported as a module of its own) or
    "package.module:agent". Raises AgentFunctionError naming the key, the file and the fix."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise AgentFunctionError(
            f"{KEY}={spec!r} is not 'path/to/file.py:function' or 'module:function'; name the file (or "
            "module) and the agent function, e.g. agents/calc.py:agent"
        )
    module, named = _import(spec)
    fn = getattr(module, name, None)
    problem = _problem(fn, spec, name, named)
    if problem is not None or fn is None:
        raise AgentFunctionError(str(problem))
    return fn


def check_agent_function(spec: str) -> list[str]:
    """The problems of `spec` (empty when the agent loads and has the right shape), for config checks."""
    problems = []
    if importlib.util.find_spec("openai") is None:
        problems.append(f"{KEY}={spec}: the agent's client needs the `openai` package; pip install openai")
    try:
        load_agent_function(spec)
    except AgentFunctionError as e:
        problems.append(str(e))
    return problems


def _describe(e: BaseException, agent: Callable[..., Any]) -> str:
    text = f"{type(e).__name__}: {e}"
    code = getattr(agent, "__code__", None)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if code and f.filename == code.co_filename]
    if frames:
        text += f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})"
    return text


def _reward(value: Any) -> AgentOutcome:
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return AgentOutcome(float(value), None)
    if isinstance(value, numbers.Real):
        return AgentOutcome(None, f"the agent returned {value!r}; return a finite number as the reward")
    return AgentOutcome(
        None, f"the agent returned a {type(value).__name__} ({value!r:.80}); return the reward as a number"
    )


def run_agents(
    agent: Callable[..., Any],
    samples: list[dict],
    base_url: str,
    session_ids: list[str],
    concurrency: int,
    timeout_s: float,
) -> list[AgentOutcome]:
    """Run `agent(client, sample)` for every sample, `concurrency` at a time, on a fresh event loop in
    the calling thread; each agent's client sends its session id in every request. An agent that
    raises, times out or returns no number gives an outcome with `error` set; this never raises for
    an agent's fault. Outcomes are in the samples' order. Call it from a thread without a running
    event loop (the rollout's worker thread)."""
    import openai

    if len(samples) != len(session_ids):
        raise ValueError(f"run_agents: {len(samples)} samples but {len(session_ids)} session ids")
    if concurrency < 1:
        raise ValueError(f"run_agents: concurrency={concurrency} must be at least 1")

    tls = ssl.create_default_context()

    async def one(sample: dict, session: str, gate: asyncio.Semaphore) -> AgentOutcome:
        async with gate:
            client = openai.AsyncOpenAI(
                base_url=base_url,
                api_key="megarl",
                default_headers={SESSION_HEADER: session},
                max_retries=0,
                timeout=timeout_s,
                # loopback: an http(s)_proxy in the environment must not catch it. One TLS context for
                # all: building one per client costs ≈ 45 ms of CPU (it loads the CA bundle)
                http_client=openai.DefaultAsyncHttpx2Client(trust_env=False, verify=tls),
            )
            try:
                task = asyncio.ensure_future(agent(client, sample))
                done, _ = await asyncio.wait({task}, timeout=timeout_s)
                if not done:
                    task.cancel()
                    await asyncio.wait({task})
                    return AgentOutcome(
                        None, f"TimeoutError: the agent did not finish within {timeout_s:g} s"
                    )
                if task.cancelled():
                    return AgentOutcome(None, "CancelledError: the agent's own task was cancelled")
                if task.exception() is not None:
                    return AgentOutcome(None, _describe(task.exception(), agent))
                return _reward(task.result())
            except Exception as e:  # agent(...) itself raised before returning a coroutine
                return AgentOutcome(None, _describe(e, agent))
            finally:
                await client.close()

    async def all_agents() -> list[AgentOutcome]:
        gate = asyncio.Semaphore(concurrency)
        return list(await asyncio.gather(*(one(s, sid, gate) for s, sid in zip(samples, session_ids))))

    return asyncio.run(all_agents())
