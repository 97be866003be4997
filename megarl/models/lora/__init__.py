"""LoRA adapters inside megatron-core's parallel linear layers.

Adapters are per Hugging Face projection ("canonical" LoRA): a fused megatron `linear_qkv` holds separate
(A, B) pairs for q, k and v, and `linear_fc1` for gate and up, so an adapter is exactly a PEFT adapter
and what vLLM's LoRA layers hold. `targets` names and shapes them, `layers` adds them to the linears,
`apply` puts them into a built model, `peft_io` reads and writes PEFT's files, `merge` folds them into
the base weights.
"""
