"""The multi-turn rollout's settings (verl's rollout.multi_turn and rollout.agent; megarl.agentic): part of
`megarl.config.schema`, in a file of their own."""

from __future__ import annotations

from dataclasses import dataclass, field

from megarl.config.options import AgentLoop, ToolCallFormat, TruncateSide


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts with tools (verl's rollout.multi_turn; megarl.agentic): the engine generates an
    assistant turn, the turn's tool calls run, their results are appended as tool messages with the chat
    template, and the engine continues, until the model answers without a call, a turn limit is reached or
    the response budget (data.max_response_length tokens: generated and given tokens together, as in verl)
    is spent. Only the generated tokens are trained on (response_mask 0 on tool outputs). Needs
    rollout.tp=1 and rollout.placement=colocated (refused otherwise); the megatron and fsdp actors both
    run it (the same engine)."""

    enable: bool = False  # multi-turn rollouts with the agent loop of rollout.agent.default_agent_loop
    # assistant turns per sample at most; None = no limit but the response budget (verl: None, which its
    # sglang path turns into max_length // 3)
    max_assistant_turns: int | None = None
    # user (tool or environment) turns per sample at most; None = no limit but the response budget (as verl)
    max_user_turns: int | None = None
    # verl's tool YAML: tools: [{class_name, config, tool_schema}], class_name a dotted path or, megarl
    # only, "file.py:ClassName"; None = the `tools` list alone
    tool_config_path: str | None = None
    # megarl only (verl lists tools in tool_config_path alone): tools by name, the built-ins "calculator"
    # (exact integer arithmetic) and "python" (code run in a sandboxed process), or "file.py:function" (a
    # plain function; its schema from the signature and docstring). Added to tool_config_path's tools
    tools: list[str] = field(default_factory=list)
    max_parallel_calls: int = 1  # tool calls of one turn run at once at most (verl's meaning); ≥ 1
    # characters of one tool result the model reads at most (verl's meaning: characters, not tokens); ≥ 1
    max_tool_response_length: int = 256
    # which part of a longer tool result is kept, verl's words and marks: "left" its start (+ "...(truncated)"),
    # "right" its end ("(truncated)..." + it), "middle" both halves around "...(truncated)..."
    tool_response_truncate_side: TruncateSide = "middle"
    # megarl only: seconds one tool call may take before it fails as a timeout (the model reads an error
    # message; counted in agent/tool_errors/timeout). verl has no limit of its own
    tool_timeout_s: float = 10.0
    # how the model writes tool calls: "hermes" = <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    # (verl's default; verl also has llama3_json and others, megarl only hermes so far)
    format: ToolCallFormat = "hermes"
    # megarl only: the environment of default_agent_loop=env_agent, "file.py:ClassName", a class with
    # reset(sample) (its return value is not used) and step(action_text) -> (observation, reward, done). verl's
    # nearest is interaction_config_path (megarl has none)
    environment: str | None = None


@dataclass
class AgentConfig:
    """Which agent loop a multi-turn rollout runs (verl's rollout.agent; megarl.agentic)."""

    # verl: agent-loop worker processes; megarl: tool/agent threads running at once per engine replica
    # (the engine itself batches the turns of every running sample); ≥ 1
    num_workers: int = 8
    # "single_turn_agent": one response per prompt (what rollout.multi_turn.enable=false does);
    # "tool_agent": assistant turns and tool calls (verl's two names); megarl only: "env_agent": turns
    # against rollout.multi_turn.environment, "openai_agent": rollout.agent.agent_function drives the
    # conversation through an OpenAI-compatible endpoint served by the engine. With env_agent and
    # openai_agent the reward is the agent's: unless reward.weights names agent_reward, the config loader
    # sets reward.weights.agent_reward=1.0 and reward.weights.function=0.0 (function kept when named).
    # verl picks the loop per row with the dataset's agent_name column; megarl runs one loop per run
    default_agent_loop: AgentLoop = "single_turn_agent"
    # megarl only: "file.py:agent", an `async def agent(client, sample) -> float` whose client is an
    # openai.AsyncOpenAI talking to the engine; its return value is the sample's agent_reward
    agent_function: str | None = None
    # megarl only: seconds one agent_function call (a whole conversation) may take; past it the agent is
    # cancelled, its sample keeps the tokens so far with agent_reward 0, counted in agent/tool_errors/agent_error
    timeout_s: float = 600.0
