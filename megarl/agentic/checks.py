"""The multi-turn config's user files, loaded for real before any process starts: the tools (imported and
built as the rollout will), the environment class and the agent function. `megarl.config.agentic_checks`
checks the same keys at load time without importing anything (it parses the files)."""

from __future__ import annotations

from megarl.config.errors import ConfigError
from megarl.config.schema import RolloutConfig


def check_agentic_files(rollout: RolloutConfig) -> None:
    """Raise ConfigError listing every problem with the files rollout.multi_turn / rollout.agent name."""
    mt, agent = rollout.multi_turn, rollout.agent
    if not mt.enable:
        return
    problems: list[str] = []
    if agent.default_agent_loop == "tool_agent":
        from megarl.agentic.tools import check_tool_config

        problems += check_tool_config(
            list(mt.tools), mt.tool_config_path, mt.max_tool_response_length, mt.tool_response_truncate_side
        )
    if agent.default_agent_loop == "env_agent" and mt.environment:
        from megarl.agentic.environment import environment_problems

        problems += environment_problems(mt.environment)
    if agent.default_agent_loop == "openai_agent" and agent.agent_function:
        from megarl.agentic.agents import check_agent_function

        problems += check_agent_function(agent.agent_function)
    if problems:
        raise ConfigError(problems)
