"""The rollout interface: prompts in, sampled responses with the engine's own log-probs out.

`Rollout.generate(batch, sampling)` takes a Batch of left-padded prompts and returns verl's rollout
schema, one row per sample, the samples of a prompt adjacent (m = prompts × sampling.n rows):

| column              | shape        | what                                                               |
|---------------------|--------------|--------------------------------------------------------------------|
| `prompts`           | [m, P] long  | the prompt, left-padded with the pad id (as given)                 |
| `responses`         | [m, R] long  | sampled tokens, right-padded with the pad id; R = max_tokens       |
| `input_ids`         | [m, P+R]     | prompts ‖ responses                                                |
| `attention_mask`    | [m, P+R] long| 1 on real prompt and response tokens                               |
| `response_mask`     | [m, R] float | 1 on sampled tokens (the stop/EOS token included)                  |
| `rollout_log_probs` | [m, R] fp32  | the engine's log-prob of each sampled token; 0 on padding (only    |
|                     |              | when asked for: `generate(..., log_probs=True)`)                   |
| `uid`               | [m]          | the prompt's group id (the input's `uid` column, else its row)     |
| `finish_reason`     | [m] str      | "stop" (EOS, stop token or stop string) or "length" (max_tokens)   |
| `rollout_token_versions` | [m, R] long | the weights version that sampled each token; -1 on padding    |
|                     |              | (partial rollouts only: `generate(..., between_steps=...)`)        |
| `rollout_version`   | [m] long     | the oldest version among the row's tokens (with the column above)  |

Every other input column (and `meta`) is carried through, repeated once per sample. The names are
`megarl.protocol.Col`'s. `response_mask` is what the loss trains on; a rollout that inserts tokens the
policy did not sample (a multi-turn rollout's tool outputs) sets it to 0 there and keeps
`attention_mask` 1, so the model still reads them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from megarl.config.schema import SamplingConfig
from megarl.protocol import Batch, Col

ROLLOUT_COLUMNS = (
    Col.PROMPTS,
    Col.RESPONSES,
    Col.INPUT_IDS,
    Col.ATTENTION_MASK,
    Col.RESPONSE_MASK,
    Col.UID,
    Col.FINISH_REASON,
)  # and Col.ROLLOUT_LOG_PROBS when asked for; the two version columns from partial rollouts


@dataclass(frozen=True)
class Sample:
    """One generated response: its tokens, the engine's log-prob of each, and why it ended."""

    token_ids: list[int]
    log_probs: list[float] | None  # None when the engine was not asked for them
    finish_reason: str
    versions: list[int] | None = None  # the weights version that sampled each token (partial rollouts)
    # multi-turn rollouts (megarl.agentic): 1 on tokens the engine sampled, 0 on tokens it was given
    # (tool outputs, user turns, the chat template's turn boundaries); None = every token sampled
    mask: list[int] | None = None
    # the prompt this sample was generated from when it is not the batch row's (an agent's first request)
    prompt_ids: list[int] | None = None


class Rollout(ABC):
    """A generation engine seen from the trainer."""

    @abstractmethod
    def generate(self, batch: Batch, sampling: SamplingConfig, log_probs: bool = True) -> Batch:
        """Sample `sampling.n` responses per prompt of `batch`; returns the schema in this module's doc,
        without `rollout_log_probs` unless `log_probs`."""


def prompt_token_ids(batch: Batch) -> list[list[int]]:
    """Each row's real prompt tokens: `prompts` with the left padding (attention_mask == 0) removed."""
    prompts, mask = batch[Col.PROMPTS], batch[Col.ATTENTION_MASK].bool()
    if prompts.shape != mask.shape:
        raise ValueError(f"prompts {tuple(prompts.shape)} and attention_mask {tuple(mask.shape)} differ")
    lengths = mask.sum(dim=1)
    # Left padding: row i's mask is (P - len_i) zeros then len_i ones.
    expected = torch.arange(mask.shape[1]) >= (mask.shape[1] - lengths)[:, None]
    bad = ((mask != expected).any(dim=1) | (lengths == 0)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"prompt rows {bad} are not left-padded non-empty prompts (check attention_mask)")
    return [row[m].tolist() for row, m in zip(prompts, mask)]


def rollout_batch(batch: Batch, samples: list[list[Sample]], max_tokens: int, pad_token_id: int) -> Batch:
    """Assemble the rollout schema from `batch` (the prompts) and `samples[i]` (prompt i's samples)."""
    if len(samples) != len(batch):
        raise ValueError(f"got samples for {len(samples)} prompts, the batch has {len(batch)}")
    n = len(samples[0]) if samples else 0
    if any(len(s) != n for s in samples):
        raise ValueError(f"every prompt needs the same number of samples, got {[len(s) for s in samples]}")
    flat = [s for per_prompt in samples for s in per_prompt]
    with_log_probs = {s.log_probs is not None for s in flat}
    if len(with_log_probs) > 1:
        raise ValueError("either every sample has its log-probs or none has")
    with_log_probs = with_log_probs == {True}
    has_versions = {s.versions is not None for s in flat}
    if len(has_versions) > 1:
        raise ValueError("either every sample has its token versions or none has")
    with_versions = has_versions == {True}
    too_long = [len(s.token_ids) for s in flat if len(s.token_ids) > max_tokens]
    if too_long:
        raise ValueError(f"responses of {too_long} tokens exceed max_tokens={max_tokens}")

    m = len(flat)
    responses = torch.full((m, max_tokens), pad_token_id, dtype=torch.long)
    log_probs = torch.zeros(m, max_tokens, dtype=torch.float32)
    response_mask = torch.zeros(m, max_tokens, dtype=torch.float32)
    versions = torch.full((m, max_tokens), -1, dtype=torch.long)
    for row, s in enumerate(flat):
        length = len(s.token_ids)
        responses[row, :length] = torch.tensor(s.token_ids, dtype=torch.long)
        if with_log_probs:
            log_probs[row, :length] = torch.tensor(s.log_probs, dtype=torch.float32)
        if s.versions is not None:
            if len(s.versions) != length:
                raise ValueError(f"row {row}: {len(s.versions)} token versions for {length} tokens")
            versions[row, :length] = torch.tensor(s.versions, dtype=torch.long)
        if s.mask is None:
            response_mask[row, :length] = 1.0
        elif len(s.mask) != length:
            raise ValueError(f"row {row}: a mask of {len(s.mask)} for {length} tokens")
        else:
            response_mask[row, :length] = torch.tensor(s.mask, dtype=torch.float32)

    carried = batch.repeat(n)
    prompts = carried[Col.PROMPTS]
    prompt_mask = carried[Col.ATTENTION_MASK].long()
    if any(s.prompt_ids is not None for s in flat):
        prompts, prompt_mask = _own_prompts(flat, prompts, prompt_mask, pad_token_id)
    attention = torch.zeros_like(response_mask, dtype=torch.long)
    for row, s in enumerate(flat):
        attention[row, : len(s.token_ids)] = 1  # given tokens too: the model reads them
    uid = carried[Col.UID] if Col.UID in batch else torch.arange(len(batch)).repeat_interleave(n)
    own = {
        Col.PROMPTS: prompts,
        Col.RESPONSES: responses,
        Col.INPUT_IDS: torch.cat([prompts, responses], dim=1),
        Col.ATTENTION_MASK: torch.cat([prompt_mask, attention], dim=1),
        Col.RESPONSE_MASK: response_mask,
        Col.UID: uid,
        Col.FINISH_REASON: [s.finish_reason for s in flat],
    }
    if with_log_probs:
        own[Col.ROLLOUT_LOG_PROBS] = log_probs
    if with_versions:
        own[Col.ROLLOUT_TOKEN_VERSIONS] = versions
        oldest = versions.masked_fill(versions < 0, torch.iinfo(torch.long).max).amin(1)
        own[Col.ROLLOUT_VERSION] = oldest.masked_fill(response_mask.sum(1) == 0, -1)  # -1: no tokens
    out = carried.select([k for k in carried.keys() if k not in own])
    for key, value in own.items():
        out[key] = value
    return out


def _own_prompts(
    samples: list[Sample], prompts: torch.Tensor, mask: torch.Tensor, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts and their mask with each sample's own `prompt_ids` (left-padded to the batch's width)
    in place of its row's."""
    prompts, mask = prompts.clone(), mask.clone()
    width = prompts.shape[1]
    for row, s in enumerate(samples):
        if s.prompt_ids is None:
            continue
        if len(s.prompt_ids) > width:
            raise ValueError(
                f"row {row}: the agent's prompt has {len(s.prompt_ids)} tokens, more than the batch's "
                f"{width} (data.max_prompt_length); raise data.max_prompt_length"
            )
        prompts[row] = pad_token_id
        mask[row] = 0
        if s.prompt_ids:
            prompts[row, -len(s.prompt_ids) :] = torch.tensor(s.prompt_ids, dtype=torch.long)
            mask[row, -len(s.prompt_ids) :] = 1
    return prompts, mask
