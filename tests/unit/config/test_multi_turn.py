"""rollout.multi_turn and rollout.agent in the config: what multi-turn rollouts refuse, which loop needs
which key, the files they name, and the agent's reward as the default of env_agent/openai_agent
(megarl.config.agentic_checks)."""

import pytest

from megarl.config import ConfigError, load_config
from megarl.config.roles import role_spec

pytestmark = pytest.mark.unit

BASE = ["model.path=/m", "trainer.n_devices_per_node=2", "algorithm.name=grpo", "rollout.n=4"]
TOOLS = [*BASE, "rollout.multi_turn.enable=true", "rollout.agent.default_agent_loop=tool_agent"]
CALC = [*TOOLS, "rollout.multi_turn.tools=[calculator]"]


def problems(*overrides: str, check_paths: bool = False) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides), check_paths=check_paths)
    return info.value.problems


def test_defaults_are_verls_and_a_tool_config_reaches_the_engines_spec():
    cfg = load_config(None, [*CALC, "rollout.multi_turn.max_assistant_turns=3"], check_paths=False)
    mt, agent = cfg.rollout.multi_turn, cfg.rollout.agent
    assert (mt.max_tool_response_length, mt.tool_response_truncate_side, mt.format) == (
        256,
        "middle",
        "hermes",
    )
    assert (mt.max_parallel_calls, mt.max_user_turns, agent.num_workers) == (1, None, 8)
    spec = role_spec(cfg, "actor").rollout
    assert spec is not None
    assert spec.rollout.multi_turn.tools == ["calculator"]
    assert spec.rollout.multi_turn.max_assistant_turns == 3
    assert spec.rollout.agent.default_agent_loop == "tool_agent"
    assert cfg.reward.weights == {}  # a tool loop keeps the rule reward


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["rollout.tp=2", "actor.parallel.tp=2"],
            "rollout.multi_turn.enable=true runs with rollout.tp=1 only for now (rollout.tp=2); set "
            "rollout.tp=1 or rollout.multi_turn.enable=false",
        ),
        (
            ["async_training.partial_rollout=true", "async_training.max_staleness=1"],
            "rollout.multi_turn.enable=true cannot continue a conversation across a weight sync yet; set "
            "async_training.partial_rollout=false or rollout.multi_turn.enable=false",
        ),
        (
            ["rollout.placement=separate"],
            "rollout.multi_turn.enable=true runs with rollout.placement=colocated only for now; set "
            "rollout.placement=colocated or rollout.multi_turn.enable=false",
        ),
        (
            ["rollout.multi_turn.max_tool_response_length=0"],
            "rollout.multi_turn.max_tool_response_length=0 must be ≥ 1; e.g. "
            "rollout.multi_turn.max_tool_response_length=1",
        ),
        (
            ["rollout.multi_turn.max_assistant_turns=0"],
            "rollout.multi_turn.max_assistant_turns=0 must be ≥ 1, or null for no limit but the response budget",
        ),
        (
            ["rollout.multi_turn.tools=[calc.txt]"],
            "rollout.multi_turn.tools[0]=calc.txt is not of the form file.py:function or a built-in "
            "(calculator, python); e.g. rollout.multi_turn.tools[0]=my_functions.py:calc.txt",
        ),
    ],
)
def test_refused_combinations_name_the_key_and_the_fix(extra, message):
    assert message in problems(*CALC, *extra)


def test_each_loop_names_the_key_it_needs():
    assert problems(*TOOLS) == [
        "rollout.agent.default_agent_loop=tool_agent needs tools: set rollout.multi_turn.tools (e.g. "
        "[calculator]) or rollout.multi_turn.tool_config_path (verl's tool YAML)"
    ]
    env = [*BASE, "rollout.multi_turn.enable=true", "rollout.agent.default_agent_loop=env_agent"]
    assert problems(*env) == [
        "rollout.agent.default_agent_loop=env_agent needs an environment: set "
        "rollout.multi_turn.environment=file.py:ClassName (a class with reset(sample) and step(action_text))"
    ]
    agent = [*BASE, "rollout.multi_turn.enable=true", "rollout.agent.default_agent_loop=openai_agent"]
    assert problems(*agent) == [
        "rollout.agent.default_agent_loop=openai_agent needs the agent: set "
        "rollout.agent.agent_function=file.py:agent (async def agent(client, sample) -> reward)"
    ]
    assert (
        "rollout.multi_turn.enable=false" in problems(*BASE, "rollout.agent.default_agent_loop=tool_agent")[0]
    )
    assert (
        "default_agent_loop=single_turn_agent generates one turn"
        in problems(*BASE, "rollout.multi_turn.enable=true")[0]
    )
    assert problems(*BASE, "rollout.agent.default_agent_loop=react") == [
        "rollout.agent.default_agent_loop=react is invalid: expected one of single_turn_agent, tool_agent, "
        "env_agent, openai_agent; e.g. rollout.agent.default_agent_loop=single_turn_agent"
    ]


def test_the_fsdp_actor_runs_multi_turn_rollouts():  # the same engine generates for both backends
    load_config(None, [*CALC, "actor.backend=fsdp"], check_paths=False)


def test_named_files_are_parsed_for_the_function_or_environment(tmp_path):
    tools = tmp_path / "tools.py"
    tools.write_text(
        "import math\n\ndef add(a: int, b: int) -> int:\n    return a + b\n\nclass Box:\n    pass\n"
    )
    env = tmp_path / "env.py"
    env.write_text("class Maze:\n    def reset(self, sample):\n        return ''\n")
    agent = tmp_path / "agent.py"
    agent.write_text("async def agent(client, sample):\n    return 1.0\n")
    # without check_paths only the form is checked: no file is read
    load_config(
        None, [*TOOLS, f"rollout.multi_turn.tools=[calculator,{tmp_path}/absent.py:f]"], check_paths=False
    )
    cfg = [*BASE, "trainer.n_devices_per_node=1", "rollout.multi_turn.enable=true"]
    assert (
        _path_problems(
            *cfg, "rollout.agent.default_agent_loop=tool_agent", f"rollout.multi_turn.tools=[{tools}:add]"
        )
        == []
    )
    assert _path_problems(
        *cfg, "rollout.agent.default_agent_loop=tool_agent", f"rollout.multi_turn.tools=[{tools}:sub]"
    ) == [
        f"rollout.multi_turn.tools[0]={tools}:sub: {tools} defines no sub at its top level; fix the name or the file"
    ]
    assert _path_problems(
        *cfg, "rollout.agent.default_agent_loop=tool_agent", f"rollout.multi_turn.tools=[{tools}:Box]"
    ) == [f"rollout.multi_turn.tools[0]={tools}:Box: Box in {tools} is a class; name a function"]
    assert _path_problems(
        *cfg, "rollout.agent.default_agent_loop=env_agent", f"rollout.multi_turn.environment={env}:Maze"
    ) == [
        f"rollout.multi_turn.environment={env}:Maze: class Maze in {env} has no step method; an environment "
        "needs reset(sample) and step(action_text) -> (observation, reward, done)"
    ]
    assert (
        _path_problems(
            *cfg,
            "rollout.agent.default_agent_loop=openai_agent",
            f"rollout.agent.agent_function={agent}:agent",
        )
        == []
    )
    missing = tmp_path / "nope.py"
    assert _path_problems(
        *cfg, "rollout.agent.default_agent_loop=openai_agent", f"rollout.agent.agent_function={missing}:agent"
    ) == [f"rollout.agent.agent_function={missing}:agent: {missing} does not exist; fix the path"]


def _path_problems(*overrides: str) -> list[str]:
    """The multi-turn problems of a config checked with its files (the machine and model checks aside)."""
    from megarl.config.agentic_checks import check_multi_turn

    cfg = load_config(None, list(overrides), check_paths=False)
    found: list[str] = []
    check_multi_turn(cfg, found, check_paths=True)
    return found


def test_env_and_openai_agents_default_to_the_agents_reward(tmp_path):
    env = tmp_path / "env.py"
    env.write_text(
        "class Maze:\n    def reset(self, sample):\n        return ''\n\n    def step(self, a):\n        return '', 1.0, True\n"
    )
    base = [*BASE, "rollout.multi_turn.enable=true", "rollout.agent.default_agent_loop=env_agent"]
    base.append(f"rollout.multi_turn.environment={env}:Maze")
    assert load_config(None, base, check_paths=False).reward.weights == {"agent_reward": 1.0, "function": 0.0}
    kept = load_config(None, [*base, "reward.weights.function=0.5"], check_paths=False)
    assert kept.reward.weights == {"agent_reward": 1.0, "function": 0.5}
    named = load_config(None, [*base, "reward.weights.agent_reward=0"], check_paths=False)
    assert named.reward.weights == {"agent_reward": 0.0}  # the user's choice stands


def test_verls_multi_turn_keys_land_on_megarls(capsys):
    verl = [
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=64",
        "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path=interaction.yaml",
    ]
    cfg = load_config(None, [*BASE, *verl, "rollout.multi_turn.tools=[calculator]"], check_paths=False)
    mt = cfg.rollout.multi_turn
    assert (mt.enable, mt.max_assistant_turns, mt.max_tool_response_length) == (True, 3, 64)
    assert mt.tool_response_truncate_side == "left"
    assert (cfg.rollout.agent.default_agent_loop, cfg.rollout.agent.num_workers) == ("tool_agent", 2)
    assert (
        "megarl: ignoring verl's actor_rollout_ref.rollout.multi_turn.interaction_config_path=interaction.yaml: "
        "megarl has no interaction config; an environment is rollout.multi_turn.environment"
    ) in capsys.readouterr().err
