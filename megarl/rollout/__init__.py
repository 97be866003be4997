"""Generation engines: the `Rollout` interface (base.py) and the in-process vLLM engine (vllm.py)."""

from megarl.rollout.base import Rollout, Sample, prompt_token_ids, rollout_batch

__all__ = ["Rollout", "Sample", "prompt_token_ids", "rollout_batch"]
