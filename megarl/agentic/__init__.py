"""Agentic (multi-turn, tool-calling) rollouts that stay in token space."""
