"""The rules of rollout.multi_turn and rollout.agent (megarl.agentic), checked with the rest of the config
before anything starts: what multi-turn rollouts cannot run with yet, which agent loop needs which key,
and that the files the keys name define what they should.

The files are read, never imported, here: a tool, environment or agent file is checked by parsing it
(the name is defined at its top level; an environment class defines reset and step), so a file that
crashes or hangs at import cannot stop a config check.
"""

from __future__ import annotations

import ast
import os

from megarl.config.errors import join
from megarl.config.schema import MegarlConfig

BUILTIN_TOOLS = ("calculator", "python")  # megarl.agentic.tools' built-ins
AGENT_REWARD = "agent_reward"  # the batch column of an environment's or agent function's reward
# the loops whose reward is the agent's: the config loader weighs reward.weights.agent_reward=1 for them
AGENT_REWARD_LOOPS = ("env_agent", "openai_agent")
MULTI_TURN_LOOPS = ("tool_agent", "env_agent", "openai_agent")


def agent_reward_weights(cfg: MegarlConfig) -> dict[str, float] | None:
    """reward.weights with the agent's reward as the default of env_agent and openai_agent
    ({agent_reward: 1.0, function: 0.0}, a named function weight kept); None when nothing changes."""
    weights = cfg.reward.weights
    if cfg.rollout.agent.default_agent_loop not in AGENT_REWARD_LOOPS or AGENT_REWARD in weights:
        return None
    return {AGENT_REWARD: 1.0, "function": 0.0} | dict(weights)


def check_multi_turn(cfg: MegarlConfig, problems: list[str], check_paths: bool) -> None:
    mt, agent = cfg.rollout.multi_turn, cfg.rollout.agent
    loop = agent.default_agent_loop
    _check_numbers(cfg, problems)
    if not mt.enable:
        if loop != "single_turn_agent":
            problems.append(
                f"rollout.agent.default_agent_loop={loop} runs multi-turn rollouts, but "
                "rollout.multi_turn.enable=false; set rollout.multi_turn.enable=true or "
                "rollout.agent.default_agent_loop=single_turn_agent"
            )
        return
    if loop == "single_turn_agent":
        problems.append(
            "rollout.multi_turn.enable=true, but rollout.agent.default_agent_loop=single_turn_agent generates "
            f"one turn; set rollout.agent.default_agent_loop to one of {join(MULTI_TURN_LOOPS)} (megarl runs "
            "one loop per run: verl's per-row agent_name column is not read)"
        )
    _check_unsupported(cfg, problems)
    if loop == "tool_agent" and not mt.tools and mt.tool_config_path is None:
        problems.append(
            "rollout.agent.default_agent_loop=tool_agent needs tools: set rollout.multi_turn.tools (e.g. "
            "[calculator]) or rollout.multi_turn.tool_config_path (verl's tool YAML)"
        )
    if loop == "env_agent" and mt.environment is None:
        problems.append(
            "rollout.agent.default_agent_loop=env_agent needs an environment: set "
            "rollout.multi_turn.environment=file.py:ClassName (a class with reset(sample) and step(action_text))"
        )
    if loop == "openai_agent" and agent.agent_function is None:
        problems.append(
            "rollout.agent.default_agent_loop=openai_agent needs the agent: set "
            "rollout.agent.agent_function=file.py:agent (async def agent(client, sample) -> reward)"
        )
    # Parsed, not imported, here; `megarl train` then loads them for real before any process starts
    # (megarl.agentic.checks.check_agentic_files).
    for i, tool in enumerate(mt.tools):
        if tool not in BUILTIN_TOOLS:
            _check_defined(f"rollout.multi_turn.tools[{i}]", tool, "function", check_paths, problems)
    if mt.tool_config_path is not None:
        _check_tool_yaml(mt.tool_config_path, check_paths, problems)
    if mt.environment is not None:
        _check_defined("rollout.multi_turn.environment", mt.environment, "class", check_paths, problems)
    if agent.agent_function is not None:
        _check_defined(
            "rollout.agent.agent_function", agent.agent_function, "function", check_paths, problems
        )


def _check_numbers(cfg: MegarlConfig, problems: list[str]) -> None:
    mt, agent = cfg.rollout.multi_turn, cfg.rollout.agent
    for key, value, low in (
        ("max_assistant_turns", mt.max_assistant_turns, 1),
        ("max_user_turns", mt.max_user_turns, 0),
    ):
        if value is not None and value < low:
            problems.append(
                f"rollout.multi_turn.{key}={value} must be ≥ {low}, or null for no limit but the response budget"
            )
    for key, value in (
        ("rollout.multi_turn.max_parallel_calls", mt.max_parallel_calls),
        ("rollout.multi_turn.max_tool_response_length", mt.max_tool_response_length),
        ("rollout.agent.num_workers", agent.num_workers),
    ):
        if value < 1:
            problems.append(f"{key}={value} must be ≥ 1; e.g. {key}=1")
    if not mt.tool_timeout_s > 0:
        problems.append(
            f"rollout.multi_turn.tool_timeout_s={mt.tool_timeout_s} must be > 0 seconds; e.g. "
            "rollout.multi_turn.tool_timeout_s=10"
        )


def _check_unsupported(cfg: MegarlConfig, problems: list[str]) -> None:
    """What multi-turn rollouts do not run with yet. Both actor backends do: the megatron and the fsdp
    actor generate with the same engine (megarl.workers.actor.ActorRole.generate)."""
    r = cfg.rollout
    if r.tp > 1:
        problems.append(
            f"rollout.multi_turn.enable=true runs with rollout.tp=1 only for now (rollout.tp={r.tp}); set "
            "rollout.tp=1 or rollout.multi_turn.enable=false"
        )
    if r.placement == "separate":
        problems.append(
            "rollout.multi_turn.enable=true runs with rollout.placement=colocated only for now; set "
            "rollout.placement=colocated or rollout.multi_turn.enable=false"
        )
    if cfg.async_training.partial_rollout:
        problems.append(
            "rollout.multi_turn.enable=true cannot continue a conversation across a weight sync yet; set "
            "async_training.partial_rollout=false or rollout.multi_turn.enable=false"
        )


def _check_defined(key: str, value: str, kind: str, check_paths: bool, problems: list[str]) -> None:
    """`value` is "file.py:name" and (with check_paths) the file defines `name` at its top level: a
    function (def or async def, or a name assigned there) or a class with reset and step."""
    path, sep, name = value.rpartition(":")
    form = "file.py:ClassName" if kind == "class" else "file.py:function"
    if not sep or not path.endswith(".py") or not name.isidentifier():
        builtin = (
            f" or a built-in ({join(BUILTIN_TOOLS)})" if key.startswith("rollout.multi_turn.tools") else ""
        )
        problems.append(
            f"{key}={value} is not of the form {form}{builtin}; e.g. {key}=my_{kind}s.py:{name or 'name'}"
        )
        return
    if not check_paths:
        return
    if not os.path.isfile(path):
        problems.append(f"{key}={value}: {path} does not exist; fix the path")
        return
    try:
        tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    except (SyntaxError, UnicodeDecodeError, ValueError) as e:
        problems.append(f"{key}={value}: {path} is not valid Python ({e}); fix the file")
        return
    node = _top_level(tree, name)
    if node is None:
        problems.append(f"{key}={value}: {path} defines no {name} at its top level; fix the name or the file")
        return
    if kind == "function" and isinstance(node, ast.ClassDef):
        problems.append(f"{key}={value}: {name} in {path} is a class; name a function")
    elif kind == "class":
        if not isinstance(node, ast.ClassDef):
            problems.append(f"{key}={value}: {name} in {path} is not a class; name the environment class")
        elif not node.bases:  # inherited methods cannot be seen without importing the file
            methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            lacking = [m for m in ("reset", "step") if m not in methods]
            if lacking:
                problems.append(
                    f"{key}={value}: class {name} in {path} has no {' and no '.join(lacking)} method; an "
                    "environment needs reset(sample) and step(action_text) -> "
                    "(observation, reward, done)"
                )


def _top_level(tree: ast.Module, name: str) -> ast.AST | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return node
    return None


def _check_tool_yaml(path: str, check_paths: bool, problems: list[str]) -> None:
    key = "rollout.multi_turn.tool_config_path"
    if not path.endswith((".yaml", ".yml")):
        problems.append(f"{key}={path} is not a YAML file; point it at verl's tool config (tools: [...])")
        return
    if not check_paths:
        return
    if not os.path.isfile(path):
        problems.append(f"{key}={path} does not exist; fix the path")
        return
    import yaml

    try:
        data = yaml.safe_load(open(path, encoding="utf-8"))
    except yaml.YAMLError as e:
        problems.append(f"{key}={path} is not valid YAML ({e}); fix the file")
        return
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, list) or not tools:
        problems.append(
            f"{key}={path} has no tools list; write tools: [{{class_name: ..., tool_schema: ...}}]"
        )
        return
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not tool.get("class_name"):
            problems.append(f"{key}={path}: tools[{i}] has no class_name; give each tool its class_name")
