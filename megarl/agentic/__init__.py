"""Multi-turn, tool-calling (agentic) rollouts: sessions in token space, tools, environments and an
OpenAI-compatible endpoint for agent harnesses."""
