"""Every megarl configuration knob, as typed dataclasses.

The field comments are the reference documentation. A YAML file mirrors this tree: top-level sections
(`model`, `actor`, `critic`, `ref`, `reward`, `rollout`, `data`, `algorithm`, `trainer`, `logging`) and
their fields; `key=value` overrides use the same dotted names (`actor.parallel.tp=2`). Load and check a
config with `megarl.config.load_config`; cross-field rules live in `megarl.config.validate`.

The `algorithm` and `preference` sections live in `megarl.config.schema_algorithm`, `<role>.lora` in
`megarl.config.schema_lora`, `actor.router_replay` and `<role>.moe` in `megarl.config.schema_moe`; the
option vocabularies (the Literals) in `megarl.config.options`. "None = auto": filled by `resolve_auto`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megarl.config.options import (
    Dtype,
    Launcher,
    LoggingBackend,
    LrDecayStyle,
    OnStale,
    OptimizerName,
    RewardBackend,
    RewardKind,
    RoleBackend,
    RolloutEngine,
    RolloutPlacement,
)
from megarl.config.schema_agentic import AgentConfig, MultiTurnConfig
from megarl.config.schema_algorithm import AlgorithmConfig, PreferenceConfig
from megarl.config.schema_lora import LoraConfig
from megarl.config.schema_moe import MoeRouterConfig, RouterReplayConfig
from megarl.distributed.layout import LayoutKeys, ParallelLayout


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Vocabulary size after Megatron's padding: `vocab_size` rounded up to a multiple of divisible_by·tp."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


@dataclass
class ModelConfig:
    path: str | None = None  # Hugging Face checkpoint dir (config.json + weights) of the policy
    tokenizer_path: str | None = None  # tokenizer dir; None = same as path
    dtype: Dtype = "bf16"  # parameter/compute dtype: "fp32" | "bf16" | "fp16" (use fp32 on CPU)
    make_vocab_size_divisible_by: int = 128  # pad the vocab to a multiple of this × TP (Megatron rule)
    gradient_checkpointing: bool = False  # recompute activations in backward to save memory
    trust_remote_code: bool = False  # allow custom modelling code shipped with the HF checkpoint


@dataclass
class ParallelConfig:
    tp: int = 1  # tensor-parallel size; divides attention heads and key/value heads
    pp: int = 1  # pipeline-parallel size; divides the number of layers
    vpp: int | None = None  # virtual pipeline stages per PP rank (interleaved schedule); None = off
    cp: int = 1  # context-parallel size (long sequences split across ranks)
    ep: int = 1  # expert-parallel size (MoE models only); divides the number of experts
    sequence_parallel: bool = False  # shard LayerNorm/dropout activations over TP; needs tp > 1


@dataclass
class OptimizerConfig:
    # megatron's optimizer: "adamw" = Adam with decoupled weight decay | "adam" = Adam with L2 weight decay
    # (added to the gradient) | "sgd" (with `momentum`). verl's `optim` has no such key: it is always AdamW
    name: OptimizerName = "adamw"
    lr: float = 1e-6  # peak learning rate
    min_lr: float = 0.0  # floor of the decayed learning rate; ≤ lr
    # decoupled for "adamw", L2 for "adam" and "sgd"; never on biases and norm weights (megatron's grouping)
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam (beta1, beta2), each in [0, 1)
    eps: float = 1e-8  # Adam epsilon
    momentum: float = 0.0  # SGD momentum in [0, 1) (megatron's sgd_momentum); 0 = plain SGD
    clip_grad: float = 1.0  # max global gradient norm; 0 = no clipping
    lr_warmup_steps: int = 0  # optimizer steps of linear warm-up from 0 to lr
    lr_decay_style: LrDecayStyle = "constant"  # after warm-up: "constant" | "cosine" | "linear" to min_lr
    use_distributed_optimizer: bool = True  # shard optimizer state over data-parallel ranks (ZeRO-1)


@dataclass
class RoleConfig:
    """A model role that runs as its own worker group (reward model); base of the trainable roles."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # this role's Megatron layout
    # the devices this role runs on: "cuda:N", "node:K/cuda:N", or "cpu:N" (a process slot on a CPU
    # machine), e.g. [cuda:0, cuda:1, cuda:2, cuda:3]; their number is the role's world size (the layout's
    # tp·pp·cp must divide it). Roles listing the same devices share them (colocated, one pool); roles on
    # disjoint devices get a pool each; a partial overlap is an error (megarl.config.placement). None =
    # n_devices below. verl instead maps roles to named resource pools in Python (resource_pool_spec +
    # mapping; reward_model.enable_resource_pool for its own RM pool); in megarl the YAML names the devices,
    # and megarl.controller.device_map.DeviceMap writes this and `parallel` from Python
    devices: list[str] | None = None
    # how many devices this role uses when `devices` is unset; None = all: the actor the whole cluster, the
    # critic and reward model the actor's devices. A critic or reward model with n_devices gets a pool of its
    # own of that many devices (Ray picks them); the pools together must fit in the cluster
    n_devices: int | None = None
    # sequences per forward/backward micro-batch on each data-parallel rank; in paired preference training
    # (dpo, ipo, orpo, simpo) a training micro-batch holds this many PAIRS (2× sequences), as in TRL
    micro_batch_size: int = 1
    # token budget per micro-batch: whole sequences are packed into one row of at most this many tokens,
    # and no padding is computed (THD layout: Transformer Engine's attention on GPU, SDPA per sequence
    # length on CPU) — verl's use_remove_padding + use_dynamic_bsz with ppo_max_token_len_per_gpu.
    # None = micro_batch_size sequences per micro-batch, right-padded to the longest
    max_tokens_per_micro_batch: int | None = None
    offload_params: bool = False  # keep parameters in CPU memory while the role is idle
    # where offloaded state goes: None = host memory (pinned; frees GPU memory), or a directory (files,
    # NVMe-offload style: the only target that frees memory on a CPU-only machine)
    offload_dir: str | None = None


@dataclass
class FSDPConfig:
    """How the fsdp backend shards a role (PyTorch FSDP2, `fully_shard` over the role's devices). verl's
    `<role>.fsdp_config`; its param_offload / optimizer_offload are megarl's offload_params /
    offload_optimizer (the same keys as the Megatron roles: state moved off the device between phases)."""

    # free each layer's gathered parameters after its forward (ZeRO-3, verl's default) or keep them until
    # the backward (ZeRO-2-like: more memory, one all-gather fewer)
    reshard_after_forward: bool = True
    # FSDP2's CPUOffloadPolicy: parameters, gradients and the optimizer step stay on the CPU throughout,
    # each layer copied to the device for its compute (verl's fsdp_config.offload_policy); GPU only
    offload_policy: bool = False
    # module class names wrapped as one FSDP unit each (verl's wrap_policy.transformer_layer_cls_to_wrap);
    # None = the model's decoder layers (transformers' _no_split_modules)
    wrap_classes: list[str] | None = None


@dataclass
class TrainRoleConfig(RoleConfig):
    """A role that is trained: it has an optimizer and can offload its training state."""

    # "megatron": megatron-core (TP/PP/CP/EP, the families of megarl's conversion tables); "fsdp": the HF model,
    # any architecture, FSDP2 over the role's devices (DP only: `parallel` stays 1). verl: <role>.strategy
    backend: RoleBackend = "megatron"
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)  # adapters instead of full training: schema_lora
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)  # MoE, actor: schema_moe
    moe: MoeRouterConfig = field(default_factory=MoeRouterConfig)  # MoE router losses: schema_moe
    offload_grads: bool = False  # move gradients to CPU while generating
    offload_optimizer: bool = False  # move optimizer state to CPU while generating


@dataclass
class CriticConfig(TrainRoleConfig):
    enable: bool | None = None  # None = auto: on when algorithm.adv_estimator is "gae"
    model_path: str | None = None  # HF checkpoint to start the value model from; None = model.path


@dataclass
class RefConfig:
    """The frozen reference policy. By default it lives in the actor's processes (colocated), with the
    actor's parallel layout and devices; given devices of its own it runs as its own worker group there."""

    # None = auto: on when a KL term is used (use_kl_in_reward or use_kl_loss) and for dpo, ipo and kto
    enable: bool | None = None
    # the reference's devices (forms as actor.devices). None or the actor's devices = inside the actor's
    # processes (verl's colocated reference); devices disjoint from the actor's = its own worker group there
    # (verl has no separate reference pool)
    devices: list[str] | None = None
    # its layout on devices of its own; None = the actor's (actor.parallel). Inside the actor's processes
    # it must be null or equal to actor.parallel (one megatron layout per process)
    parallel: ParallelConfig | None = None
    micro_batch_size: int = 1  # sequences per log-prob forward on each data-parallel rank
    max_tokens_per_micro_batch: int | None = None  # token budget per micro-batch; None = micro_batch_size
    offload_params: bool = False  # keep parameters in CPU memory between uses
    # "megatron" | "fsdp" (see actor.backend); None = the actor's. In the actor's processes a reference of
    # another backend needs an actor layout of tp = pp = cp = 1 (one layout per process)
    backend: RoleBackend | None = None
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class RewardFunctionConfig:
    """A reward function in a Python file, called for every row instead of the built-in rule rewards
    (verl's `custom_reward_function.path/name`). Its signature is verl's:
    `compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict`, called with
    keyword arguments; a dict's "score" is the reward and its other numeric keys become metrics
    (`reward/<key>/mean`). To keep the rule rewards for some rows, call
    `megarl.rewards.default_compute_score` from it (verl's `default_compute_score`). Before any worker
    starts, the file is imported in a process of its own and verl's call is bound to the function's
    signature: a mismatch, or a file that fails, crashes or hangs at import, stops the run there."""

    path: str | None = None  # the .py file; None = the rule reward registered for each row's data_source
    name: str = "compute_score"  # the function's name in that file


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment (verl's `reward_model.overlong_buffer`): a response of L tokens
    whose length falls within the last `len` tokens before the response limit gets
    -penalty_factor · (L - (max_tokens - len)) / len added to its reward; up to -penalty_factor at the
    limit, 0 before the buffer. The limit is rollout.max_tokens, else data.max_response_length."""

    enable: bool = False  # add the penalty
    len: int = 0  # buffer length in tokens, in [1, response limit] when enabled
    penalty_factor: float = 1.0  # penalty at the limit; ≥ 0


@dataclass
class RewardModelConfig(RoleConfig):
    """The reward: the model-free score of each response (a rule reward chosen by the row's data_source,
    or `function`), the reward model's score when one is enabled, and extra terms, summed with `weights`."""

    function: RewardFunctionConfig = field(default_factory=RewardFunctionConfig)
    # weight of each reward term in the summed reward: "function" (the rule reward or reward.function),
    # "rm" (the reward model's rm_scores), or the name of any [n] tensor column an added pipeline stage
    # writes (e.g. "curriculum"). A term not listed weighs 1.0 ("rm" only when the reward model is on);
    # weight 0 switches a term off (weights={function: 0} scores with the reward model alone). Not in verl,
    # where a reward model's score replaces the rule reward instead of adding to it
    weights: dict[str, float] = field(default_factory=dict)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # Reward functions (the rule rewards and reward.function) run in reward worker processes, started
    # once per run (megarl.rewards.pool): a call that raises, calls sys.exit or os._exit, crashes or runs
    # past timeout_s fails that row only — it scores 0, counts in reward/errors (shown on the console line)
    # and the first failure is logged with its traceback. verl's default (naive) reward manager calls
    # compute_score in the driver process with no time limit, so one hang stops its run forever
    timeout_s: float = 10.0  # seconds one reward call may take; 0 = no limit
    # stop the run (naming the function and its first failure) when more than this fraction of a step's rows
    # fail; a step where every row fails stops it at any setting
    max_error_fraction: float = 0.5
    # reward worker processes; None = min(4, CPUs available / torchrun ranks on the node), at least 1;
    # 0 = call the function in the driver process (no timeout, no protection from os._exit or a crash:
    # verl's behaviour)
    workers: int | None = None
    enable: bool | None = None  # None = auto: on when model_path is set; off = rule rewards on the driver
    model_path: str | None = None  # HF checkpoint of the reward model (Megatron RM or sequence classifier)
    # "megatron": a *ForSequenceClassification RM of a supported decoder family (Llama/Mistral/Qwen2/Qwen3)
    # on megatron-core with this role's TP/PP, scoring the policy's tokens; "hf": any transformers
    # AutoModelForSequenceClassification (DeBERTa, BERT, ...) or sentence-embedding model, data-parallel,
    # re-tokenising the decoded text with its own tokenizer; "fsdp": the same, the model sharded with FSDP2
    # over the role's devices (each rank holds 1/N of it: for an RM too large to replicate). verl:
    # reward_model.strategy
    backend: RewardBackend = "megatron"
    # hf backend: "classifier" (the model's logit) | "embedding_similarity" (cosine similarity of the
    # response to the row's ground_truth text, mean-pooled embeddings)
    kind: RewardKind = "classifier"
    max_length: int = 512  # hf backend: tokens per scored text at most (also capped by the model's limit)
    label_index: int = 0  # hf backend: which logit is the reward when the classifier has several labels


@dataclass
class SFTMultiturnConfig:
    """verl's data.multiturn: SFT on chat conversations (megarl.data.sft)."""

    # true: each row's messages_key column is a conversation and every assistant turn (after at least one
    # other turn) is trained on, the turns before it as its prompt — one example per assistant turn, where
    # verl packs the conversation into one sequence (the same tokens are trained on; megarl renders each
    # context with the generation prompt, as RL prompts are). false: rows hold prompt/response columns, or
    # else a messages list whose last turn, an assistant's, is the response
    enable: bool = False
    messages_key: str = "messages"  # column holding the conversation ([{role, content}, ...])


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)  # parquet/jsonl files of training prompts
    val_files: list[str] = field(default_factory=list)  # parquet/jsonl files for evaluation; [] = none
    prompt_key: str = "prompt"  # column holding the prompt (chat messages or a string)
    # render prompts with the tokenizer's chat template (generation prompt appended). Chat-list prompts
    # always need it; a string prompt is wrapped as one user message first (as verl's SFT data is), or,
    # with false or a tokenizer without a template, tokenised as-is
    apply_chat_template: bool = True
    # tokens per prompt at most; with max_response_length (or the longest rollout.max_tokens) within the
    # model's positions (max_position_embeddings of model.path's config.json), checked at load
    max_prompt_length: int = 512
    # drop (and count per file, in one warning) prompts longer than max_prompt_length; false = stop with
    # an error naming them. A prompt so long in characters that it surely is too long is dropped without
    # being tokenised (megarl.data.lengths). verl's default instead errors (data.truncation=error) or
    # truncates
    filter_overlong_prompts: bool = True
    max_response_length: int = 512  # tokens generated per sample at most
    train_batch_size: int = 64  # prompts per training step (each sampled rollout.n times)
    val_batch_size: int | None = None  # prompts per validation generate call; None = all of data.val_files
    response_key: str = "response"  # SFT: column holding the response (rows may instead hold `messages`)
    # SFT, verl's single-turn keys: the prompt (response) is column prompt_key (response_key) indexed by
    # each of these keys in turn. verl's GSM8K SFT recipe: prompt_key=extra_info, prompt_dict_keys=[question],
    # response_key=extra_info, response_dict_keys=[answer]. The dotted form prompt_key=extra_info.question
    # reads the same (a column whose own name has the dot is read first). SFT only, as in verl
    prompt_dict_keys: list[str] = field(default_factory=list)
    response_dict_keys: list[str] = field(default_factory=list)
    multiturn: SFTMultiturnConfig = field(default_factory=SFTMultiturnConfig)
    chosen_key: str = "chosen"  # DPO/IPO/ORPO/SimPO: preferred response column (string or assistant turn)
    rejected_key: str = "rejected"  # DPO/IPO/ORPO/SimPO: dispreferred response column (same forms as chosen)
    completion_key: str = "completion"  # KTO: labelled response column (string or assistant turn)
    label_key: str = "label"  # KTO: column saying whether the completion is desirable (bool or 0/1)
    shuffle: bool = True  # shuffle training prompts every epoch
    seed: int = 1  # seed of the shuffling order


@dataclass
class SamplingConfig:
    """How one generation call samples. Training rollouts use the `rollout.*` fields, evaluation
    `rollout.val.*`. The engine returns each sampled token's log-prob under the distribution it was drawn
    from: softmax(logits / temperature) restricted to top_k/top_p (plain softmax when greedy)."""

    n: int = 1  # samples per prompt (GRPO/RLOO need ≥ 2)
    temperature: float = 1.0  # sampling temperature; 0 = greedy
    top_p: float = 1.0  # nucleus sampling mass, in (0, 1]
    top_k: int = -1  # sample from the k most likely tokens; -1 or 0 = disabled
    max_tokens: int | None = None  # tokens generated per sample at most; None = data.max_response_length
    # token ids that end a sample (besides the tokenizer's EOS, which always does); the stop token is
    # kept as the response's last token
    stop_token_ids: list[int] = field(default_factory=list)
    # strings that end a sample once the decoded response contains one; the tokens spelling it are kept
    stop: list[str] = field(default_factory=list)


@dataclass
class RolloutConfig(SamplingConfig):
    """The generation engine, and (inherited from SamplingConfig) how training rollouts are sampled."""

    engine: RolloutEngine = "vllm"  # generation engine
    tp: int = 1  # generation tensor-parallel size (t_g); divides actor.parallel.tp and key/value heads
    expert_parallel_size: int = 1  # verl's; = rollout.tp: whole experts split over the engine (schema_moe)
    # base of the per-request sampling seeds (each generate call and each prompt gets its own, derived
    # from this, the generation replica and the call count); None = trainer.seed
    seed: int | None = None
    # evaluation sampling (data.val_files): greedy, one sample per prompt unless set
    val: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0))
    max_num_seqs: int = 256  # sequences the engine schedules at once
    gpu_memory_utilization: float = 0.5  # fraction of device memory the engine may use, in (0, 1]
    # exact KV-cache size in bytes; overrides the fraction. Required on CPU (the fraction would be of RAM)
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False  # no CUDA graphs, no torch.compile of the engine's model (also on CPU)
    # the engine's log-probs (rollout_log_probs; verl's key): None = only when algorithm.rollout_correction
    # reads them (verl: off); true also logs train_rollout_logprob_abs_diff. Cost: a log-softmax per token
    calculate_log_probs: bool | None = None
    # weight sync (3D-HybridEngine): tensors are streamed into the engine in buckets of about this size
    reshard_bucket_mib: int = 256
    # weight sync by full all-gather of every tensor to every rank (a baseline for benchmarks and tests)
    naive_reshard: bool = False
    # where the engines run. colocated: inside the actor's processes, the training shards regrouped into
    # the engine in place before each generation (the 3D-HybridEngine). separate: a pool of their own
    # (rollout.n_devices or rollout.devices, disjoint from the actor's; rollout.tp per engine), each
    # engine rank receiving its TP shard straight from the training ranks that hold it after every
    # update (megarl.hybrid.pool_sync); needed by async_training. Needs trainer.launcher=ray and
    # actor.backend=megatron. verl: its one-step-off/fully-async trainers' rollout.nnodes/n_gpus_per_node
    placement: RolloutPlacement = "colocated"
    # separate pools: leave out of each sync the tensors unchanged since the last one (frozen layers),
    # found by comparing with a host copy of what was sent (one copy of each training rank's shards)
    sync_skip_unchanged: bool = False
    devices: list[str] | None = None  # the separate pool's devices (forms as actor.devices)
    n_devices: int | None = None  # the separate pool's size when rollout.devices is unset
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)  # tool-calling rollouts (verl's)
    agent: AgentConfig = field(default_factory=AgentConfig)  # which agent loop runs them (verl's)


@dataclass
class AsyncTrainingConfig:
    """Generation overlapping training (rollout.placement=separate): the engines generate the next
    batches while the trainer updates. A sample's version is the weights version (updates done) that
    generated its oldest token; at training time its staleness = the trainer's version - that."""

    # how many model versions a trained sample may lag behind: 0 = synchronous (the same metrics as a
    # colocated run), 1 = verl's one-step-off-policy, K = up to K batches generated ahead. verl's fully
    # async trainer bounds a fraction of samples instead (async_training.staleness_threshold)
    max_staleness: int = 0
    # a group past max_staleness (possible when partial rollouts carry a sample across syncs): drop it
    # from the batch, or wait for it to be generated again with the current weights
    on_stale: OnStale = "wait"
    # at a weight sync the engines pause their in-flight requests, take the new weights and continue them
    # (their tokens kept, each with the behaviour log-prob and version that sampled it; the response
    # budget never overshot) instead of finishing them on the old weights first. verl's key
    partial_rollout: bool = False


def longest_response(rollout: RolloutConfig, max_response_length: int) -> tuple[str, int]:
    """(the key that sets it, tokens) of the longest response the rollout engine generates, training or
    evaluation: what, with data.max_prompt_length, the engine's sequences must hold."""
    keys = [("rollout.max_tokens", rollout.max_tokens), ("rollout.val.max_tokens", rollout.val.max_tokens)]
    lengths = [(key, n) if n else ("data.max_response_length", max_response_length) for key, n in keys]
    return max(lengths, key=lambda kv: kv[1])


@dataclass
class TrainerConfig:
    nnodes: int = 1  # machines in the cluster
    # GPUs per machine (processes per machine on CPU). A single-node run that starts here (torchrun, or
    # Ray without RAY_ADDRESS) is held at load to this machine's GPUs, or without GPUs to 2 processes per
    # core (at least 16: CPU slots are Ray bookkeeping), megarl.config.machine
    n_devices_per_node: int = 1
    # verl's balance_batch: reorder each step's rollouts so every data-parallel rank of the actor gets
    # about the same number of real tokens (equal row counts) before the log-prob and update stages
    balance_batch: bool = True
    total_epochs: int = 1  # passes over the training data
    total_steps: int | None = None  # training steps; None = total_epochs × steps per epoch
    # save <output_dir>/checkpoints/step_<N>/ every N steps and after the last; 0 = only after the last;
    # -1 = never (verl's save_freq). A checkpoint holds every trained role (weights, optimizer, LR
    # schedule, RNG), the data position, the trainer's state and the resolved config
    save_every: int = 0
    # keep the newest K complete checkpoints (older ones are deleted after a save); None = keep all
    # (verl's max_actor_ckpt_to_keep)
    max_checkpoints: int | None = None
    # also write the final actor as a Hugging Face model to <output_dir>/hf (a config error when that is,
    # contains or lies inside model.path or another model the run reads)
    save_hf: bool = False
    eval_every: int = 0  # evaluate on data.val_files every N steps (and after the last); 0 = never
    val_before_train: bool = True  # evaluate on data.val_files before the first step (logged as step 0)
    # evaluate on data.val_files once, at the step the run starts from, and stop without training (verl's)
    val_only: bool = False
    # write every validation response (input, output, score) to <dir>/step_<N>.jsonl; None = don't
    # (verl's trainer.validation_data_dir)
    validation_data_dir: str | None = None
    # checkpoints, logs and reports go here; one run at a time (<output_dir>/run.lock; verl has no lock)
    output_dir: str = "outputs/run"
    # "auto": continue from <output_dir>/checkpoints/latest when there is one (else start afresh);
    # "disable": always start afresh; or a checkpoint: a step directory, a run's checkpoints/ or the
    # run directory. A resumed run continues exactly where the checkpoint was saved (bit-exact on the
    # same layout); the actor/critic layouts may differ from the saved ones (weights and optimizer
    # state are resharded; RNG states then restart from the seed)
    resume: str = "auto"
    seed: int = 42  # global seed (weights of new heads, sampling, dropout)
    launcher: Launcher = "ray"  # "ray" (worker groups, multi-node) | "torchrun" (SPMD, also SLURM srun)
    # steps (1-based) to profile: a torch.profiler chrome trace per rank of profile_ranks and every rank's
    # seconds per worker call, under <output_dir>/profile/step_<N>/ (see megarl.observe.profiling)
    profile_steps: list[int] = field(default_factory=list)
    # ranks of the actor's (and critic's) worker group that get a trace; every rank's call times are kept
    profile_ranks: list[int] = field(default_factory=lambda: [0])
    # the longest one worker call (Ray: the driver kills the group after it) or one collective (every
    # process group's timeout, torchrun and Ray) may take before the run fails; 30 min like NCCL's default
    worker_timeout_s: float = 1800.0
    # stop the run after this many steps in a row whose update was skipped for a NaN/inf gradient norm
    max_bad_steps: int = 3
    # after SIGTERM or SIGUSR1 (SLURM's time limit, preemption or `--signal=B:USR1@120`; scancel; kill)
    # the running step may take this long to finish; then a checkpoint of it is saved (whatever
    # save_every says) and the run exits 75, to be resumed by the same command. A step still running
    # after it is abandoned (the last saved checkpoint stays). Keep it plus a save below the time the
    # scheduler waits before SIGKILL. verl has no such key (SIGTERM ends a verl run where it is)
    preempt_grace_s: float = 60.0


@dataclass
class LoggingConfig:
    # where metrics go besides <trainer.output_dir>/metrics.jsonl (always written): any of "console",
    # "jsonl" (accepted; the file is written anyway), "tensorboard", "wandb"
    backends: list[LoggingBackend] = field(default_factory=lambda: ["console"])
    project: str = "megarl"  # wandb project (TensorBoard writes to <trainer.output_dir>/tensorboard)
    run_name: str | None = None  # None = auto: derived from the algorithm, model and start time
    log_every: int = 1  # print every N-th step's line (metrics.jsonl always gets every step)
    # write <trainer.output_dir>/report/ (PNG curves + report.md) when the run ends or crashes (a few
    # seconds on the driver); `megarl report RUN_DIR` draws it later from the files either way
    report: bool = True


@dataclass
class MegarlConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: TrainRoleConfig = field(default_factory=TrainRoleConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    reward: RewardModelConfig = field(default_factory=RewardModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def cluster_size(self) -> int:
        """All devices of the cluster: trainer.nnodes × trainer.n_devices_per_node."""
        return self.trainer.nnodes * self.trainer.n_devices_per_node

    def parallel_of(self, role: str) -> ParallelConfig:
        """The parallel layout a role runs with (the reference's is the actor's unless ref.parallel is set)."""
        if role == "ref":
            return self.ref.parallel or self.actor.parallel
        return getattr(self, role).parallel

    def backend_of(self, role: str) -> str:
        """What runs a role's model: "megatron" or "fsdp" (the reference's is the actor's unless ref.backend
        is set; a reward model's reward.backend has its own vocabulary)."""
        if role == "ref":
            return self.ref.backend or self.actor.backend
        return getattr(self, role).backend

    def parallel_key(self, role: str) -> str:
        """The config section a role's layout comes from (`actor.parallel` for a reference without its own)."""
        return "actor.parallel" if role == "ref" and self.ref.parallel is None else f"{role}.parallel"

    def world_size(self, role: str) -> int:
        """Devices (processes) in a role's worker group: len(<role>.devices) when set; else n_devices; else
        the whole cluster for the actor and the actor's for the others."""
        section = getattr(self, role)
        if section.devices is not None:
            return len(section.devices)
        n_devices = getattr(section, "n_devices", None)
        if n_devices is not None:
            return n_devices
        return self.cluster_size() if role == "actor" else self.world_size("actor")

    def layout(self, role: str) -> ParallelLayout:
        """A role's ParallelLayout over its devices; a LayoutError naming the role's config keys when the
        layout cannot work."""
        return ParallelLayout.from_config(
            self.parallel_of(role), self.world_size(role), LayoutKeys(self.parallel_key(role))
        )
