"""Multi-turn agentic rollouts: tool calls, chat formats, trajectories and the agent loop."""
