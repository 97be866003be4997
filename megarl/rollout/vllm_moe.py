"""vLLM 0.32.0 serving a mixture-of-experts checkpoint: weight updates into the CPU experts, and the experts
each token was routed to (rollout routing replay, R3).

Weight updates. vLLM's CPU fused-MoE kernel pads each expert's intermediate dimension and prepacks the
expert weights into its grouped-GEMM layout (`CPUUnquantizedExperts.process_weights_after_loading`). On
a weight update (`reload_weights`, megarl's sync path) `UnquantizedFusedMoEMethod._setup_kernel` skips that
step: the experts then hold the checkpoint layout while the kernel reads them as packed (generation is
silently wrong), or the copy fails with a size mismatch where the padding changed the shape.
`repack_experts_on_update` makes updates run the step too, as the first load does. One engine layer holds
every expert of an MoE block, and a push that sends part of them leaves it half-loaded (NaN outputs):
`expert_layers` names its checkpoint tensors so that `VLLMRollout.load_weights` refuses such a push.

Expert parallelism (`rollout.expert_parallel_size` = rollout.tp: vLLM's enable_expert_parallel, each
engine rank holding a contiguous block of whole experts). vLLM 0.32's CPU kernel
(`CPUUnquantizedExperts.apply`) is handed the expert map and ignores it: it indexes the rank's local
experts with the router's global ids and reads past them (the process dies). `local_expert_ids_on_cpu`
maps the ids to local ones first. Each rank's push carries its block only; vLLM's weight loader takes
global expert ids and skips the others, and `expert_layers` lists the block's tensors only.

Routes. vLLM's own `enable_return_routed_experts` needs Model Runner V2 (triton), so it cannot run on CPU.
`RouteRecorder` hooks every MoE router's capture callback instead and files each step's top-k expert ids
by (engine request, token position), from the model runner's batch buffers at forward time. A prefix-cache
hit skips the forward of the cached blocks, so their routes are never seen: engines that record routes
run without prefix caching. Both reach into vLLM internals; this module refuses any other vLLM version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from megarl.protocol import Batch, Col
from megarl.rollout.vllm_groups import check_vllm_version

NO_ROUTE = -1  # a position whose route is unknown (padding, the never-forwarded last token)


def is_moe(hf_config) -> bool:
    """Whether a Hugging Face config describes a mixture-of-experts model (routed experts per layer)."""
    return bool(getattr(hf_config, "num_experts", 0) or getattr(hf_config, "num_local_experts", 0))


def repack_experts_on_update() -> None:
    """Patch vLLM's unquantized MoE method (process-wide, idempotent) so that a weight update of CPU experts
    re-runs their pad-and-prepack step before vLLM's layer-wise reload copies the result into the kernel's
    tensors. Other experts' kernels (GPU) are left as vLLM has them."""
    check_vllm_version()
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod as Method,
    )

    setup = Method._setup_kernel
    if getattr(setup, "megarl_repacks", False):
        return

    def setup_kernel(self, layer, w13, w2) -> None:
        update = self.moe_kernel is not None
        setup(self, layer, w13, w2)
        if update and isinstance(self.moe_kernel.fused_experts, CPUUnquantizedExperts):
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)

    setup_kernel.megarl_repacks = True
    Method._setup_kernel = setup_kernel


def local_expert_ids_on_cpu() -> None:
    """CPU shim (process-wide, idempotent) for vLLM's expert parallelism: CPU unquantized experts receive
    the router's ids mapped through the expert map, a route to another rank's expert kept as local id 0
    with weight 0 (that rank adds its share in the engine's all-reduce). GPU kernels honour the map
    themselves and are left alone; quantized CPU experts refuse expert maps in vLLM already."""
    check_vllm_version()
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts as Experts

    apply = Experts.apply
    if getattr(apply, "megarl_local_ids", False):
        return

    def mapped(self, *args, topk_weights, topk_ids, expert_map, **kwargs):  # vLLM passes keywords
        if expert_map is not None:
            local = expert_map[topk_ids.long()]
            topk_weights = topk_weights.masked_fill(local < 0, 0.0)
            topk_ids = local.clamp(min=0).to(topk_ids.dtype)
        return apply(self, *args, topk_weights=topk_weights, topk_ids=topk_ids, expert_map=None, **kwargs)

    mapped.megarl_local_ids = True
    Experts.apply = mapped


def expert_layers(model: torch.nn.Module) -> dict[str, set[str]]:
    """For each fused-experts layer of an engine model (`...mlp.experts.routed_experts`), the Hugging Face
    names of every tensor that fills it (`...mlp.experts.{e}.{gate,up,down}_proj.weight` for every expert
    it holds: all, or under expert parallelism its block): a push that sends part of them leaves the
    layer half-loaded (its outputs NaN). {} for a dense model."""
    check_vllm_version()
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    layers = {}
    for path, runner in model.named_modules():
        if not isinstance(runner, MoERunner):
            continue
        experts = runner.routed_experts
        own = [name for name, _ in experts.named_parameters(recurse=False)]
        names = set()
        # (param "experts.w13_", checkpoint "experts.{e}.gate_proj.", ...): both relative to the runner's parent
        for param, checkpoint, expert, _ in experts.get_expert_mapping():
            if not experts.expert_map_manager.is_local_expert(expert):
                continue  # another engine rank's expert (expert parallelism)
            stem = param.rpartition(".")[2]
            names.update(
                f"{path.rpartition('.')[0]}.{checkpoint}{n[len(stem) :]}" for n in own if n.startswith(stem)
            )
        layers[next(f"{path}.{name}" for name, m in runner.named_children() if m is experts)] = names
    return layers


class RouteRecorder:
    """On an engine worker: the top-k expert ids each MoE layer's router picked for every token forwarded,
    per engine request, as int16 [positions, MoE layers, top-k] (NO_ROUTE where nothing was forwarded).

    Each layer's ids go into one step buffer; after the last MoE layer the step is filed by request, from
    the runner's batch (its request ids, query start offsets and positions). A position forwarded again
    (a preempted request's recompute) takes the newer route."""

    def __init__(self, runner, routers: Sequence) -> None:
        if not routers:
            raise ValueError("the served model has no MoE router to record routes from")
        self.runner = runner
        layer_ids = sorted(r.layer_id for r in routers)
        self.layer_index = {layer: i for i, layer in enumerate(layer_ids)}
        self.last_layer = layer_ids[-1]
        self.topk = routers[0].router.top_k
        self.step = torch.full(
            (runner.max_num_tokens, len(layer_ids), self.topk),
            NO_ROUTE,
            dtype=torch.int16,
            device=runner.device,
        )
        self.routes: dict[str, torch.Tensor] = {}
        for r in routers:
            r.router.set_capture_fn(lambda ids, layer=r.layer_id: self.capture(layer, ids))

    @property
    def num_layers(self) -> int:
        return len(self.layer_index)

    def capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        batch = self.runner.input_batch
        if batch.num_reqs == 0:  # a dummy forward
            return
        tokens = int(self.runner.query_start_loc.cpu[batch.num_reqs])
        self.step[:tokens, self.layer_index[layer]] = topk_ids[:tokens]
        if layer == self.last_layer:
            self._file(tokens)

    def _file(self, tokens: int) -> None:
        batch = self.runner.input_batch
        starts = self.runner.query_start_loc.cpu[: batch.num_reqs + 1].tolist()
        first = self.runner.positions[starts[:-1]].tolist()  # a request's positions in a step are consecutive
        step = self.step[:tokens].cpu()
        for req, a, b, position in zip(batch.req_ids, starts, starts[1:], first):
            end = position + b - a
            routes = self.routes.get(req)
            if routes is None or routes.shape[0] < end:
                routes = self._grow(req, routes, end)
            routes[position:end] = step[a:b]

    def _grow(self, req: str, routes: torch.Tensor | None, end: int) -> torch.Tensor:
        """A request's route tensor, sized for its prompt and token budget (at least `end` positions)."""
        state = self.runner.requests[req]
        budget = len(state.prompt_token_ids or ()) + (state.sampling_params.max_tokens or 0)
        grown = torch.full((max(end, budget), self.num_layers, self.topk), NO_ROUTE, dtype=torch.int16)
        if routes is not None:
            grown[: routes.shape[0]] = routes
        self.routes[req] = grown
        return grown

    def take(self) -> dict[str, torch.Tensor]:
        """The routes recorded since the last take, by engine request id; the recorder starts empty."""
        routes, self.routes = self.routes, {}
        return routes


def install_route_recorder(worker) -> tuple[int, int]:
    """On an engine worker (`llm.collective_rpc`): record routes from now on. Returns (MoE layers, top-k)."""
    check_vllm_version()
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runner = worker.model_runner
    routers = [m for m in runner.model.modules() if isinstance(m, MoERunner)]
    worker.megarl_routes = RouteRecorder(runner, routers)
    return worker.megarl_routes.num_layers, worker.megarl_routes.topk


def take_routes(worker) -> dict[str, torch.Tensor]:
    """On an engine worker (`llm.collective_rpc`): `RouteRecorder.take`."""
    return worker.megarl_routes.take()


def request_key(engine_request_id: str) -> str:
    """The request an engine (internal) request id belongs to, as `sample_key` names it: vLLM 0.32 appends
    8 random characters ("{id}-{rand}") to the caller's id, which for the samples of an n > 1 request is
    "{index}_{id}"."""
    return engine_request_id.rsplit("-", 1)[0]


def sample_key(request_id: str, index: int, n: int) -> str:
    """The key `request_key` gives sample `index` of request `request_id` (the id vLLM's output carries)."""
    return f"{index}_{request_id}" if n > 1 else request_id


def routes_column(
    routes: Sequence[torch.Tensor | None],
    prompt_lengths: Sequence[int],
    response_lengths: Sequence[int],
    prompt_width: int,
    response_width: int,
    num_layers: int,
    topk: int,
) -> torch.Tensor:
    """`Col.ROUTED_EXPERTS` [m, P+R, L, k] int16 aligned with input_ids (left-padded prompt ‖ right-padded
    response) from each row's recorded routes ([positions, L, k] by token position; None: none recorded).
    Every position but the last token's was forwarded; NO_ROUTE on padding and on that last token."""
    out = torch.full(
        (len(routes), prompt_width + response_width, num_layers, topk), NO_ROUTE, dtype=torch.int16
    )
    for row, (r, p, t) in enumerate(zip(routes, prompt_lengths, response_lengths)):
        if r is None:
            continue
        forwarded = min(p + t - 1, r.shape[0])
        seq = r[:forwarded]
        out[row, prompt_width - p : prompt_width] = seq[:p]
        out[row, prompt_width : prompt_width + forwarded - p] = seq[p:]
    return out


def rollout_routes(
    rollout: Batch, outputs: Sequence, routes: Mapping[str, torch.Tensor], shape: tuple[int, int]
) -> torch.Tensor:
    """`Col.ROUTED_EXPERTS` of a single-turn rollout (`rollout_batch`'s result) from vLLM's `RequestOutput`s,
    `take_routes`' result and the recorder's (MoE layers, top-k)."""
    width = rollout[Col.PROMPTS].shape[1]
    attention = rollout[Col.ATTENTION_MASK]
    return routes_column(
        sample_routes(outputs, routes),
        attention[:, :width].sum(1).tolist(),
        attention[:, width:].sum(1).tolist(),
        width,
        rollout[Col.RESPONSES].shape[1],
        *shape,
    )


def sample_routes(outputs: Sequence, routes: Mapping[str, torch.Tensor]) -> list[torch.Tensor | None]:
    """Each sample's routes (rows in `rollout_batch` order: prompt by prompt, a prompt's samples by index)
    from vLLM's `RequestOutput`s and `take_routes`' result."""
    by_key = {request_key(engine_id): r for engine_id, r in routes.items()}
    return [
        by_key.get(sample_key(out.request_id, c.index, len(out.outputs)))
        for out in outputs
        for c in sorted(out.outputs, key=lambda c: c.index)
    ]
