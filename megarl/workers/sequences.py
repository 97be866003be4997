"""From a rollout Batch to the micro-batches a Megatron model consumes, and back.

A rollout Batch follows verl's schema: `input_ids` [n, P+R] = left-padded prompt ‖ right-padded response,
`attention_mask` [n, P+R], `responses` [n, R], `response_mask` [n, R]. Inside the workers every sequence is
first reduced to its real tokens (prompt then response, no padding: every token with attention_mask 1),
then laid out in one of two ways:

  pad    micro-batches of `micro_batch_size` rows, right-padded to one length. Right padding needs no
         attention mask: causal attention already keeps real tokens from seeing the pads after them.
  pack   every micro-batch is ONE row of a fixed token budget holding several whole sequences back to
         back (longest first), positions restarting at 0 for each; cu_seqlens in THD layout keep them
         apart (Transformer Engine's attention, or megarl's SDPA attention on CPU: no padding computed),
         or a block-diagonal causal mask over the row where the attention cannot take THD.

Either way all micro-batches of one schedule call have the same shape (megatron's pipeline exchanges
fixed-shape activations), and each carries `index` [k, R]: for response token j of its k sequences, the
flat position in [rows × length] whose output predicts it (the logit for a log-prob, the state value for a
critic). Per-token results therefore come back in the Batch's own [n, R] layout.

Two masks, two jobs: `attention_mask` says which tokens the model reads, `response_mask` which response
tokens the loss trains on. They differ where a multi-turn rollout inserted tokens the policy did not
sample (tool outputs): read as context, never trained on. Each micro-batch's `mask` is the batch's
`response_mask` (derived from attention_mask only when the batch has none), and so are the token counts
that normalise a loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from megarl.protocol import Col


@dataclass
class Sequences:
    """The real tokens of each row of a rollout batch, and which response tokens the loss trains on."""

    tokens: list[torch.Tensor]  # prompt tokens then response tokens, 1-D, no padding
    prompt_lens: list[int]
    loss_mask: torch.Tensor  # [n, R] float: the batch's response_mask (1 = trained on)
    # MoE routes to replay: per row [len(tokens), L, k] int16 (the batch's routed_experts at its real
    # tokens, megarl.models.moe_replay.row_routes); None when the batch has none
    routes: list[torch.Tensor] | None = None
    # per row, the response tokens the loss trains on (the ones of loss_mask): a loss's token counts.
    # Fewer than the response's real tokens where the rollout masked some out.
    response_lens: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.response_lens = (self.loss_mask > 0).sum(dim=1).tolist()

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def response_width(self) -> int:
        """R: the Batch's response columns."""
        return self.loss_mask.shape[1]

    @property
    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]

    def subset(self, rows: list[int]) -> Sequences:
        return Sequences(
            [self.tokens[r] for r in rows],
            [self.prompt_lens[r] for r in rows],
            self.loss_mask[rows],
            None if self.routes is None else [self.routes[r] for r in rows],
        )


def sequences_from_batch(batch) -> Sequences:
    """Strip the padding of every row. Needs `input_ids`, `attention_mask` and `responses`; the loss mask
    is the batch's `response_mask`, or, where it has none, the real response tokens of attention_mask."""
    for key in (Col.INPUT_IDS, Col.ATTENTION_MASK, Col.RESPONSES):
        if key not in batch.tensors.keys():
            raise KeyError(
                f"the batch has no {key!r} column; a rollout batch needs input_ids, attention_mask and "
                f"responses (got {sorted(batch.tensors.keys())})"
            )
    input_ids, attention = batch[Col.INPUT_IDS], batch[Col.ATTENTION_MASK].bool()
    width = batch[Col.RESPONSES].shape[1]
    prompt_width = input_ids.shape[1] - width
    attended = attention[:, prompt_width:]
    # A response is a prefix followed by padding: its mask must never switch back on.
    if (attended[:, 1:] & ~attended[:, :-1]).any():
        raise ValueError("response padding must be at the right end (attention_mask has holes in responses)")
    if Col.RESPONSE_MASK in batch.tensors.keys():
        loss_mask = batch[Col.RESPONSE_MASK].float()
        if loss_mask.shape != attended.shape:
            raise ValueError(
                f"response_mask has shape {tuple(loss_mask.shape)}, the responses {tuple(attended.shape)}"
            )
        if ((loss_mask != 0) & ~attended).any():
            raise ValueError("response_mask is 1 on padding (where attention_mask is 0)")
    else:
        loss_mask = attended.float()
    tokens = [input_ids[row][attention[row]] for row in range(len(input_ids))]
    prompt_lens = attention[:, :prompt_width].sum(dim=1).tolist()
    routes = None
    if Col.ROUTED_EXPERTS in batch.tensors.keys():
        from megarl.models.moe_replay import row_routes

        routes = row_routes(batch[Col.ROUTED_EXPERTS], attention)
    return Sequences(tokens, prompt_lens, loss_mask, routes)


def padded_length(seqs: Sequences, multiple: int = 1) -> int:
    """The longest sequence, rounded up to `multiple` (the TP size under sequence parallelism)."""
    longest = max(seqs.lengths)
    return -(-longest // multiple) * multiple


def build_microbatch(
    seqs: Sequences, rows: list[int], mode: str, length: int, rows_per_mb: int = 1, thd: bool = False
) -> dict[str, torch.Tensor]:
    """One micro-batch of `rows` laid out as `mode` ("pad": `rows_per_mb` rows of `length`; "pack": one
    row of `length` tokens). Returns model inputs plus `index`, `last_index`, `mask` and `rows`."""
    if mode == "pad":
        n_rows, starts = rows_per_mb, [(i, 0) for i in range(len(rows))]
        if len(rows) > rows_per_mb:
            raise ValueError(f"{len(rows)} sequences do not fit a micro-batch of {rows_per_mb}")
    elif mode == "pack":
        # longest first: sequences of one length sit side by side, so THD attention takes each length
        # in one call (megarl's SDPA attention); the outputs keep the order of `rows`
        n_rows, offset, starts = 1, 0, [(0, 0)] * len(rows)
        for k in sorted(range(len(rows)), key=lambda k: -len(seqs.tokens[rows[k]])):
            starts[k] = (0, offset)
            offset += len(seqs.tokens[rows[k]])
        if offset > length:
            raise ValueError(f"{offset} tokens do not fit a packed micro-batch of {length}")
    else:
        raise ValueError(f"unknown micro-batch mode {mode!r}; use 'pad' or 'pack'")

    input_ids = torch.zeros(n_rows, length, dtype=torch.long)
    labels = torch.zeros(n_rows, length, dtype=torch.long)
    positions = torch.arange(length).repeat(n_rows, 1)
    index = torch.zeros(len(rows), seqs.response_width, dtype=torch.long)
    last_index = torch.zeros(len(rows), dtype=torch.long)
    for k, (r, (row, start)) in enumerate(zip(rows, starts)):
        tokens = seqs.tokens[r]
        n = len(tokens)
        input_ids[row, start : start + n] = tokens
        labels[row, start : start + n - 1] = tokens[1:]
        positions[row, start : start + n] = torch.arange(n)
        first = row * length + start + seqs.prompt_lens[r] - 1  # output that predicts response token 0
        # every real response token, masked out or not: the mask zeroes the results, not the index
        span = n - seqs.prompt_lens[r]
        index[k, :span] = torch.arange(first, first + span)
        last_index[k] = row * length + start + n - 1
    mb = {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": positions,
        "index": index,
        "last_index": last_index,
        "mask": seqs.loss_mask[rows],
        "rows": torch.tensor(rows, dtype=torch.long),
    }
    if mode == "pack":
        lengths = sorted((len(seqs.tokens[r]) for r in rows), reverse=True)
        if thd:
            mb["cu_seqlens"] = _cu_seqlens(lengths, length)
        else:
            mb["attention_mask"] = block_causal_mask(lengths, length)
    return mb


def block_causal_mask(lengths: list[int], total: int) -> torch.Tensor:
    """[1, 1, total, total] bool, True where attention is NOT allowed: each sequence sees only its own
    earlier tokens; the trailing padding sees only itself (keeps its softmax finite)."""
    segment = torch.full((total,), -1, dtype=torch.long)
    offset = 0
    for i, n in enumerate(lengths):
        segment[offset : offset + n] = i
        offset += n
    pad = torch.arange(total) >= offset
    segment[pad] = len(lengths) + torch.arange(int(pad.sum()))
    same = segment[:, None] == segment[None, :]
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    return ~(same & causal)[None, None]


def _cu_seqlens(lengths: list[int], total: int) -> torch.Tensor:
    bounds = torch.tensor([0, *lengths]).cumsum(0)
    if bounds[-1] < total:  # the trailing padding is one more (ignored) sequence
        bounds = torch.cat([bounds, torch.tensor([total])])
    return bounds.to(torch.int32)


def scatter_rows(parts: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> torch.Tensor:
    """Reassemble per-micro-batch results (rows, values [k, ...]) into one tensor of n rows."""
    rows, values = parts[0]
    out = torch.zeros((n, *values.shape[1:]), dtype=values.dtype)
    for rows, values in parts:
        out[rows] = values
    return out
