"""Routing replay for megatron-core's MoE routers: force each token's experts, or record them.

Routes are int16 tensors [tokens, num_moe_layers, topk]: for each token the experts it was routed to in
every MoE layer of the whole model (global MoE-layer order, whatever pipeline stage holds the layer).
A token whose row in a layer holds a -1 is routed live by that layer (a route the engine did not return).

How the experts are forced: megatron-core 0.16.1's `topk_routing_with_score_function` asks the router's
`router_replay` object for the top-k (`get_replay_topk(scores, topk, num_groups, group_topk,
default_compute_topk)`). `ModelRoutes` puts a `LayerReplay` there (megatron's own RouterReplay keeps all
routers of the process in one class-level list, has no -1 fallback and needs
`moe_enable_routing_replay` at build time). Megatron then computes the gating weights from the scores
at the forced experts exactly as for experts it chose itself: softmax over the top-k logits
(moe_router_pre_softmax=False: Qwen3-MoE's norm_topk_prob), or the full softmax at those experts
(pre_softmax=True), or sigmoid scores renormalised; the scaling factor after. The weights stay a
function of the router's logits, so the router keeps its gradient.

Replayed routes live on the router until replaced: a forward recomputed in the backward (activation
checkpointing) replays the same routes as long as no other micro-batch's forward came in between (true
without pipelining; with a pipeline schedule it is not, which megarl.config.moe_checks refuses).

Lay-out helpers: `row_routes` (a rollout batch's [n, P+R, L, k] column -> each row's real tokens),
`split_rows` (per data-parallel rank, as Batch.chunk), `microbatch_routes` (one micro-batch of
megarl.workers.sequences in megatron's token order) and its inverse `rows_of_microbatch`;
`disagreement` measures how often two route sets differ.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

ROUTE_DTYPE = torch.int16
MISSING = -1  # a token/layer without a route: routed live


class LayerReplay:
    """The replay state of one MoE layer's router, in the place megatron reserves for its RouterReplay."""

    def __init__(self, moe_index: int, num_experts: int) -> None:
        self.moe_index = moe_index  # this layer's position among the model's MoE layers
        self.num_experts = num_experts
        self.routes: torch.Tensor | None = None  # [tokens, topk] forced experts; None = live routing
        self.record = False
        self.recorded: torch.Tensor | None = None  # [tokens, topk] int16, the last forward's experts

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        """megatron's hook: (the scores at the chosen experts, their indices) [tokens, topk] each."""
        values, live = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.record:
            self.recorded = live.detach().to(ROUTE_DTYPE)
        if self.routes is None:
            return values, live
        forced = self.routes.to(device=live.device, dtype=live.dtype)
        if forced.shape != live.shape:
            raise ValueError(
                f"MoE layer {self.moe_index}: routes for {tuple(forced.shape)} (tokens, topk) but the router "
                f"routes {tuple(live.shape)}; lay the routes out with microbatch_routes for this micro-batch"
            )
        chosen = torch.where((forced < 0).any(dim=-1, keepdim=True), live, forced)
        return scores.gather(1, chosen), chosen


def moe_layer_numbers(config) -> list[int]:
    """The 1-based decoder layer numbers of a model's MoE layers, by megatron's moe_layer_freq rule
    (an int N: every N-th layer from the first; a list: 1 = MoE per layer)."""
    freq = config.moe_layer_freq
    pattern = [int(i % freq == 0) for i in range(config.num_layers)] if isinstance(freq, int) else freq
    return [i + 1 for i, moe in enumerate(pattern) if moe]


def _routers(chunks: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    from megatron.core.transformer.moe.router import TopKRouter

    found = [m for chunk in chunks for m in chunk.modules() if isinstance(m, TopKRouter)]
    return sorted(found, key=lambda r: r.layer_number)


def _check_routes(routes: torch.Tensor, num_experts: int) -> None:
    if routes.dtype.is_floating_point or routes.dim() != 3:
        raise ValueError(
            f"routes must be an integer tensor [tokens, layers, topk]; got {routes.dtype} "
            f"{tuple(routes.shape)}"
        )
    if bool(((routes < MISSING) | (routes >= num_experts)).any()):
        raise ValueError(
            f"routes hold experts outside [-1, {num_experts}); -1 (route live) is the only sentinel"
        )
    ordered = routes.sort(dim=-1).values
    if bool(((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)).any()):
        raise ValueError("routes name one expert twice for a token; each of a token's top-k must differ")


class ModelRoutes:
    """The MoE routers of one model (its chunks on this rank), in global MoE-layer order."""

    def __init__(self, chunks: Sequence[torch.nn.Module]) -> None:
        routers = _routers(chunks)
        if not routers:
            raise ValueError(
                "routing replay needs an MoE model: no megatron TopKRouter in these model chunks"
            )
        config = routers[0].config
        if config.moe_router_fusion or config.moe_router_load_balancing_type == "sinkhorn":
            raise ValueError(
                "routing replay needs megatron's unfused top-k routing; unset moe_router_fusion and use a "
                "top-k load balancing type (not sinkhorn)"
            )
        numbers = moe_layer_numbers(config)
        self.num_moe_layers = len(numbers)
        self.sequence_parallel = config.sequence_parallel
        self.routers = routers
        self.layers = [LayerReplay(numbers.index(r.layer_number), config.num_moe_experts) for r in routers]
        self._saved = [r.router_replay for r in routers]
        for router, layer in zip(routers, self.layers):
            router.router_replay = layer

    def detach(self) -> None:
        """Give every router back the replay object it had (megatron's, or None)."""
        for router, saved in zip(self.routers, self._saved):
            router.router_replay = saved

    def replay(self, routes: torch.Tensor | None) -> None:
        """Force `routes` [tokens, num_moe_layers, topk] in the next forwards (tokens in megatron's order:
        microbatch_routes); None = route live again. Under sequence parallelism give the whole
        micro-batch's tokens: each rank keeps its own slice."""
        if routes is None:
            for layer in self.layers:
                layer.routes = None
            return
        _check_routes(routes, self.layers[0].num_experts)
        if routes.shape[1] != self.num_moe_layers:
            raise ValueError(
                f"routes cover {routes.shape[1]} MoE layers; the model has {self.num_moe_layers}"
            )
        if self.sequence_parallel:
            from megatron.core import parallel_state

            tp, rank = (
                parallel_state.get_tensor_model_parallel_world_size(),
                parallel_state.get_tensor_model_parallel_rank(),
            )
            routes = routes.tensor_split(tp)[rank]
        for layer in self.layers:
            layer.routes = routes[:, layer.moe_index]

    @property
    def recording(self) -> bool:
        return self.layers[0].record

    def record(self, on: bool = True) -> None:
        """Keep the experts each router chooses live (before any replay) from the next forward on."""
        for layer in self.layers:
            layer.record, layer.recorded = on, None

    def recorded(self) -> torch.Tensor:
        """The last forward's live routes [tokens, num_moe_layers, topk] int16 (tokens as the routers saw
        them), -1 at the MoE layers other pipeline stages hold: an all-reduce MAX over the pipeline group
        completes them."""
        missing = [layer.moe_index for layer in self.layers if layer.recorded is None]
        if missing:
            raise RuntimeError(f"MoE layers {missing} recorded nothing: call record() before the forward")
        tokens, topk = self.layers[0].recorded.shape
        out = torch.full((tokens, self.num_moe_layers, topk), MISSING, dtype=ROUTE_DTYPE)
        for layer in self.layers:
            out[:, layer.moe_index] = layer.recorded.cpu()
        return out


@contextmanager
def attached(chunks: Sequence[torch.nn.Module]) -> Iterator[ModelRoutes]:
    """`ModelRoutes` over the chunks for the duration of the block; the routers are restored after."""
    routes = ModelRoutes(chunks)
    try:
        yield routes
    finally:
        routes.detach()


@contextmanager
def replaying(chunks: Sequence[torch.nn.Module], routes: torch.Tensor) -> Iterator[ModelRoutes]:
    """Forwards inside the block route every token to `routes` [tokens, num_moe_layers, topk]."""
    with attached(chunks) as model_routes:
        model_routes.replay(routes)
        yield model_routes


@contextmanager
def recording(chunks: Sequence[torch.nn.Module]) -> Iterator[ModelRoutes]:
    """Forwards inside the block record their live routes: `.recorded()` after the forward."""
    with attached(chunks) as model_routes:
        model_routes.record()
        yield model_routes


def row_routes(routed_experts: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """Each row's routes at its real tokens: [n, P+R, L, k] aligned with input_ids -> n tensors
    [tokens_i, L, k], the tokens megarl.workers.sequences keeps (attention_mask 1, in order)."""
    if routed_experts.shape[:2] != attention_mask.shape:
        raise ValueError(
            f"routes {tuple(routed_experts.shape)} do not align with attention_mask "
            f"{tuple(attention_mask.shape)}"
        )
    return [routed_experts[i][attention_mask[i].bool()] for i in range(len(attention_mask))]


def split_rows(rows: Sequence[torch.Tensor], n: int) -> list[list[torch.Tensor]]:
    """The rows' routes for `n` data-parallel ranks: equal consecutive parts, as megarl's Batch.chunk."""
    if len(rows) % n:
        raise ValueError(
            f"cannot split {len(rows)} rows into {n} equal parts; pad the batch as Batch.chunk needs"
        )
    size = len(rows) // n
    return [list(rows[i * size : (i + 1) * size]) for i in range(n)]


def _token_places(mb: dict[str, torch.Tensor], lengths: Sequence[int]) -> Iterator[tuple[int, torch.Tensor]]:
    """(row, its tokens' indices in megatron's order) for each sequence of a micro-batch."""
    n_rows, length = mb["input_ids"].shape
    for k, r in enumerate(mb["rows"].tolist()):
        row, last = divmod(int(mb["last_index"][k]), length)  # flat position of the row's last token
        start = last + 1 - lengths[r]
        if start < 0:
            raise ValueError(
                f"row {r}: {lengths[r]} routes do not fit its place in the micro-batch; give one per token"
            )
        yield r, torch.arange(start, last + 1) * n_rows + row


def microbatch_routes(rows: Sequence[torch.Tensor], mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """One micro-batch's routes [rows·length, L, k] in megatron's token order (hidden states are
    [length, rows]: position-major), -1 on padding. `rows` are all the worker's rows (row_routes), `mb` a
    micro-batch of megarl.workers.sequences.build_microbatch (padded or packed); each row's routes must
    cover all its tokens (an engine's route for the last, never-forwarded token is -1)."""
    n_rows, length = mb["input_ids"].shape
    first = rows[int(mb["rows"][0])]
    out = torch.full((n_rows * length, *first.shape[1:]), MISSING, dtype=ROUTE_DTYPE)
    for r, places in _token_places(mb, [len(t) for t in rows]):
        out[places] = rows[r].to(ROUTE_DTYPE)
    return out


def rows_of_microbatch(
    routes: torch.Tensor, mb: dict[str, torch.Tensor], lengths: Sequence[int]
) -> dict[int, torch.Tensor]:
    """The inverse of microbatch_routes: {row: its routes [lengths[row], L, k]} from a micro-batch's
    routes in megatron's order (what `ModelRoutes.recorded` gives for it), to replay them in other
    micro-batches (R2: recorded in the old-log-prob forward, replayed in the update's)."""
    return {r: routes[places] for r, places in _token_places(mb, lengths)}


def disagreement(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """How differently two route tensors [tokens, L, k] route (the trainer's live routes vs the engine's):
    the share of (token, layer) pairs with another expert set, and of tokens with one in any layer.
    Pairs where either holds a -1 are left out."""
    known = (a >= 0).all(dim=-1) & (b >= 0).all(dim=-1)
    differ = (a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1) & known
    tokens = known.any(dim=1)
    return {
        "layer_token_share": float(differ.sum() / known.sum().clamp(min=1)),
        "token_share": float(differ.any(dim=1).sum() / tokens.sum().clamp(min=1)),
    }
