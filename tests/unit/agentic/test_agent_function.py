"""Loading and checking `rollout.agent.agent_function` (megarl.agentic.agents): from a file or a module,
and each bad spec named with its fix."""

from __future__ import annotations

import textwrap

import pytest

from megarl.agentic.agents import AgentFunctionError, check_agent_function, load_agent_function

pytestmark = pytest.mark.unit


def write(tmp_path, source: str, name: str = "agent.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_load_agent_function_from_a_file_or_a_module(tmp_path, monkeypatch):
    path = write(tmp_path, "async def agent(client, sample):\n    return 1.0\n", "my_agents.py")
    assert load_agent_function(f"{path}:agent").__name__ == "agent"
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_agent_function("my_agents:agent").__module__ == "my_agents"
    assert check_agent_function(f"{path}:agent") == []


def test_bad_agent_functions_are_named_with_the_fix(tmp_path):
    path = write(
        tmp_path,
        """
        import asyncio
        def sync_agent(client, sample):
            return 1.0
        async def one_arg(client):
            return 1.0
        async def flexible(client, sample, *, retries=3, **kwargs):
            return 1.0
        """,
    )
    broken = write(tmp_path, "raise RuntimeError('no GPU here')\n", "broken.py")
    key, sig = "rollout.agent.agent_function", "`async def agent(client, sample) -> float`"
    assert check_agent_function(f"{path}:flexible") == []
    expected = {
        f"{tmp_path}/none.py:agent": f"{key}={tmp_path}/none.py:agent: {tmp_path}/none.py does not exist; point it at a .py file",
        f"{path}:missing": f"{key}={path}:missing: {path} does not define 'missing'; define {sig} in it",
        f"{path}:sync_agent": f"{key}={path}:sync_agent: sync_agent in {path} is a function but not async; define it as {sig}",
        f"{path}:asyncio": f"{key}={path}:asyncio: asyncio in {path} is a module; define it as {sig}",
        f"{path}:one_arg": f"{key}={path}:one_arg: one_arg(client) in {path} cannot be called as agent(client, sample); define it as {sig}",
        f"{broken}:agent": f"{key}={broken}:agent: importing {broken} failed: RuntimeError: no GPU here; fix the file (it must only define functions at import)",
        "no_such_module_xyz:agent": f"{key}=no_such_module_xyz:agent: cannot import module 'no_such_module_xyz' (No module named 'no_such_module_xyz'); give a module on the Python path or a file path, e.g. path/to/agent.py:agent",
        "agent.py": f"{key}='agent.py' is not 'path/to/file.py:function' or 'module:function'; name the file (or module) and the agent function, e.g. agents/calc.py:agent",
    }
    for spec, message in expected.items():
        assert check_agent_function(spec) == [message]
        with pytest.raises(AgentFunctionError) as caught:
            load_agent_function(spec)
        assert str(caught.value) == message
