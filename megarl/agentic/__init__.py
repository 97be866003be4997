"""Multi-turn, tool-calling rollouts that stay in token space (agent loops, tools, environments, an
OpenAI-compatible endpoint for agent harnesses)."""
