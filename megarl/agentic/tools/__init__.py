"""Tools the model calls during a multi-turn rollout."""
