"""Hugging Face config -> megatron-core TransformerConfig and GPTModel arguments (Llama family and its
mixture-of-experts relatives).

Family differences (Llama, Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE) are data in `FAMILIES`, not
branches.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.nn.functional as F

from megarl.distributed.layout import ParallelLayout
from megarl.distributed.platform import platform
from megarl.errors import EXIT_USAGE, MegarlError
from megarl.models import dtypes


class UnsupportedModelError(MegarlError, ValueError):
    """The HF checkpoint uses a feature megarl does not convert."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Family:
    qkv_bias_key: str | None  # HF config key that turns q/k/v bias on; None when fixed by the family
    qkv_bias_default: bool
    qk_norm: bool
    moe: bool = False  # every decoder layer's MLP is a routed mixture of experts
    shared_expert: bool = False  # plus a shared expert scaled by sigmoid(shared_expert_gate(x))


FAMILIES: dict[str, Family] = {
    "llama": Family(qkv_bias_key="attention_bias", qkv_bias_default=False, qk_norm=False),
    "mistral": Family(qkv_bias_key=None, qkv_bias_default=False, qk_norm=False),
    "qwen2": Family(qkv_bias_key=None, qkv_bias_default=True, qk_norm=False),
    "qwen3": Family(qkv_bias_key="attention_bias", qkv_bias_default=False, qk_norm=True),
    "qwen2_moe": Family(
        qkv_bias_key="qkv_bias", qkv_bias_default=True, qk_norm=False, moe=True, shared_expert=True
    ),
    "qwen3_moe": Family(qkv_bias_key="attention_bias", qkv_bias_default=False, qk_norm=True, moe=True),
}

# megatron's router modules, one per MoE layer ({i}: the global layer index): what router replay wraps.
ROUTER_MODULE = "decoder.layers.{i}.mlp.router"


@dataclass(frozen=True)
class MoE:
    """The mixture-of-experts part of an architecture (HF names in the comments)."""

    num_experts: int  # num_experts (transformers 5 writes num_local_experts)
    topk: int  # num_experts_per_tok
    ffn_hidden_size: int  # moe_intermediate_size: one expert's
    norm_topk_prob: bool  # the top-k probabilities renormalised to sum to 1
    shared_expert_size: int  # shared_expert_intermediate_size; 0: no shared expert
    # router_aux_loss_coef, counted (as in HF training) only where output_router_logits is true
    aux_loss_coeff: float
    z_loss_coeff: float  # router_z_loss_coef (absent in the Qwen configs: 0)
    # megatron's moe_router_load_balancing_type; None: "aux_loss" where aux_loss_coeff > 0, else "none"
    load_balancing_type: str | None = None

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], family: Family) -> MoE:
        if cfg.get("decoder_sparse_step", 1) != 1:
            raise UnsupportedModelError(
                f"decoder_sparse_step={cfg['decoder_sparse_step']}: megarl converts MoE models whose every "
                "layer is sparse (decoder_sparse_step=1)"
            )
        if cfg.get("mlp_only_layers"):
            raise UnsupportedModelError(
                f"mlp_only_layers={cfg['mlp_only_layers']}: megarl converts MoE models without dense layers "
                "(mlp_only_layers=[])"
            )
        shared = int(cfg.get("shared_expert_intermediate_size") or 0) if family.shared_expert else 0
        if family.shared_expert and shared <= 0:
            raise UnsupportedModelError(
                f"shared_expert_intermediate_size={shared}: {cfg['model_type']} needs a shared expert (> 0)"
            )
        return cls(
            num_experts=cfg.get("num_experts") or cfg["num_local_experts"],
            topk=cfg["num_experts_per_tok"],
            ffn_hidden_size=cfg["moe_intermediate_size"],
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
            shared_expert_size=shared,
            aux_loss_coeff=float(cfg.get("router_aux_loss_coef", 0.0))
            if cfg.get("output_router_logits")
            else 0.0,
            z_loss_coeff=float(cfg.get("router_z_loss_coef") or 0.0),
        )

    def transformer_config_fields(self) -> dict[str, Any]:
        """megatron's MoE TransformerConfig fields: the all-to-all token dispatcher, routing in fp32."""
        return dict(
            num_moe_experts=self.num_experts,
            moe_router_topk=self.topk,
            moe_ffn_hidden_size=self.ffn_hidden_size,
            # softmax over all experts then top-k (HF's order); without that, top-k logits then softmax
            # over them: the renormalised probabilities of norm_topk_prob
            moe_router_pre_softmax=not self.norm_topk_prob,
            moe_router_score_function="softmax",
            moe_router_dtype="fp32",
            moe_shared_expert_intermediate_size=self.shared_expert_size or None,
            moe_shared_expert_gate=self.shared_expert_size > 0,
            moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=False,  # SequentialMLP: per-expert linears, HF's per-expert tensors
            moe_router_load_balancing_type=self.load_balancing_type
            or ("aux_loss" if self.aux_loss_coeff else "none"),
            moe_aux_loss_coeff=self.aux_loss_coeff,
            moe_z_loss_coeff=self.z_loss_coeff or None,
        )


_LLAMA3_ROPE_DEFAULTS = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True)
class ModelArchitecture:
    """Everything needed to build a GPTModel equal to one HF checkpoint."""

    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    norm_eps: float
    rope_theta: float
    rope_type: str
    rope_factor: float
    tie_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    hf_config: dict[str, Any]
    head: str = "lm"  # "lm": vocabulary logits; "scalar": one value per token (critic / reward model)
    moe: MoE | None = None  # None: a dense model

    @property
    def num_experts(self) -> int:
        """Routed experts per layer; 0 for a dense model."""
        return self.moe.num_experts if self.moe else 0

    @property
    def moe_topk(self) -> int:
        """Experts each token is routed to; 0 for a dense model."""
        return self.moe.topk if self.moe else 0

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArchitecture:
        model_type = cfg.get("model_type")
        if model_type not in FAMILIES:
            raise UnsupportedModelError(
                f"model_type={model_type!r} is not supported; supported: {sorted(FAMILIES)}"
            )
        family = FAMILIES[model_type]
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"hidden_act={cfg['hidden_act']!r}: only 'silu' (SwiGLU) is supported"
            )
        if cfg.get("mlp_bias"):
            raise UnsupportedModelError("mlp_bias=True is not supported")
        if cfg.get("use_sliding_window"):
            raise UnsupportedModelError("use_sliding_window=True is not supported")
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type == "llama3":
            for key, default in _LLAMA3_ROPE_DEFAULTS.items():
                if float(rope.get(key, default)) != default:
                    raise UnsupportedModelError(
                        f"llama3 rope scaling with {key}={rope[key]} (only {default})"
                    )
        elif rope_type not in ("default", "linear"):
            raise UnsupportedModelError(f"rope_type={rope_type!r} is not supported (default, linear, llama3)")
        heads = cfg["num_attention_heads"]
        architecture = (cfg.get("architectures") or [""])[0]
        scalar = architecture.endswith(("ForSequenceClassification", "ForTokenClassification"))
        if scalar and len(cfg.get("id2label") or {0: 0}) != 1:
            raise UnsupportedModelError(
                f"{architecture} with {len(cfg['id2label'])} labels: only 1 (a scalar score)"
            )
        qkv_bias = (
            cfg.get(family.qkv_bias_key, family.qkv_bias_default)
            if family.qkv_bias_key
            else family.qkv_bias_default
        )
        return cls(
            family=model_type,
            num_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            ffn_hidden_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_type=rope_type,
            rope_factor=float(rope.get("factor", 1.0)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(qkv_bias),
            qk_norm=family.qk_norm,
            hf_config=cfg,
            head="scalar" if scalar else "lm",
            moe=MoE.from_hf_config(cfg, family) if family.moe else None,
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelArchitecture:
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(
                f"{config_file} not found: is {path} a Hugging Face checkpoint directory?"
            )
        return cls.from_hf_config(json.loads(config_file.read_text()))

    def with_scalar_head(self) -> ModelArchitecture:
        """The same backbone with a value head instead of the LM head (critic from a policy checkpoint)."""
        return dataclasses.replace(self, head="scalar")

    def with_router_losses(
        self, aux_loss_coeff: float | None, z_loss_coeff: float | None, load_balancing_type: str | None
    ) -> ModelArchitecture:
        """The router's load-balancing and z-loss settings replaced where given (megatron's names; None:
        the checkpoint's); a dense model is returned as it is."""
        if self.moe is None:
            return self
        given = {
            "aux_loss_coeff": aux_loss_coeff,
            "z_loss_coeff": z_loss_coeff,
            "load_balancing_type": load_balancing_type,
        }
        moe = dataclasses.replace(self.moe, **{k: v for k, v in given.items() if v is not None})
        return dataclasses.replace(self, moe=moe)

    def transformer_config(self, layout: ParallelLayout, dtype: str = "fp32", recompute: bool = False):
        """The megatron TransformerConfig for this architecture under `layout`; `recompute` re-runs every
        layer's forward in backward instead of keeping its activations (gradient checkpointing)."""
        from megatron.core.transformer import TransformerConfig

        torch_dtype = dtypes.torch_dtype(dtype)
        return TransformerConfig(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_heads,
            num_query_groups=self.num_kv_heads,
            kv_channels=self.head_dim,
            ffn_hidden_size=self.ffn_hidden_size,
            normalization="RMSNorm",
            layernorm_epsilon=self.norm_eps,
            gated_linear_unit=True,
            activation_func=F.silu,
            add_bias_linear=False,
            add_qkv_bias=self.qkv_bias,
            qk_layernorm=self.qk_norm,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            attention_softmax_in_fp32=True,
            bias_activation_fusion=False,
            masked_softmax_fusion=False,
            apply_rope_fusion=False,
            gradient_accumulation_fusion=False,
            persist_layer_norm=False,
            params_dtype=torch_dtype,
            pipeline_dtype=torch_dtype,
            bf16=dtype == "bf16",
            fp16=dtype == "fp16",
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp,
            context_parallel_size=layout.cp,
            sequence_parallel=layout.sequence_parallel,
            # Batched p2p and per-micro-batch lengths on NCCL; gloo needs both off.
            **platform().pipeline_p2p,
            # Initialisation is what tags TP parameters (tensor_model_parallel, partition_dim); the
            # per-shard ("gpu") path does it without materialising full weights on every rank.
            use_cpu_initialization=False,
            perform_initialization=True,
            recompute_granularity="full" if recompute else None,
            recompute_method="uniform" if recompute else None,
            recompute_num_layers=1 if recompute else None,
            expert_model_parallel_size=layout.ep,
            **(self.moe.transformer_config_fields() if self.moe else {}),
        )

    def gpt_model_kwargs(self, padded_vocab: int) -> dict[str, Any]:
        return dict(
            vocab_size=padded_vocab,
            max_sequence_length=self.max_position_embeddings,
            share_embeddings_and_output_weights=self.tie_embeddings and self.head == "lm",
            position_embedding_type="rope",
            rotary_base=int(self.rope_theta),
            rope_scaling=self.rope_type == "llama3",
            rope_scaling_factor=self.rope_factor if self.rope_type == "llama3" else 8.0,
            seq_len_interpolation_factor=self.rope_factor if self.rope_type == "linear" else None,
        )
