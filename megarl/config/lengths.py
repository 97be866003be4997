"""The token lengths a run asks for against what its models take: the prompt limit plus the longest
response must fit every model's positions (`max_position_embeddings` of its config.json). Read at load
time, so the rollout engine never refuses the length itself (naming its own settings, not megarl's)."""

from __future__ import annotations

from megarl.config.parallel_checks import ModelDims
from megarl.config.schema import MegarlConfig, longest_response
from megarl.config.validate_algorithm import RL_ALGORITHMS

__all__ = ["check_sequence_length"]


def check_sequence_length(cfg: MegarlConfig, dims: dict[str, ModelDims], problems: list[str]) -> None:
    """The longest sequence (the prompt limit plus the longest response) fits each model's positions
    (`max_position_embeddings` of its config.json); the rollout engine would refuse it, naming its own
    settings instead of megarl's."""
    d = cfg.data
    response_key, response = "data.max_response_length", d.max_response_length
    if cfg.algorithm.name in RL_ALGORITHMS:
        response_key, response = longest_response(cfg.rollout, d.max_response_length)
    total = d.max_prompt_length + response
    models = [("actor", "model.path", cfg.model.path), ("reward", "reward.model_path", cfg.reward.model_path)]
    if cfg.critic.model_path:
        models.insert(1, ("critic", "critic.model_path", cfg.critic.model_path))
    seen = set()
    for role, key, path in models:
        limit = dims[role].max_position_embeddings if role in dims else None
        if limit is None or total <= limit or path in seen:
            continue
        seen.add(path)
        prompt = limit - response
        fix = (
            f"e.g. data.max_prompt_length={prompt}"
            if prompt >= 1
            else f"e.g. data.max_prompt_length={limit - limit // 2} and {response_key}={limit // 2}"
        )
        problems.append(
            f"data.max_prompt_length + {response_key} = {d.max_prompt_length} + {response} = {total} tokens "
            f"exceed the {limit} positions of the model at {key} (max_position_embeddings in its config.json); "
            f"lower them to sum to at most {limit}, {fix}"
        )
