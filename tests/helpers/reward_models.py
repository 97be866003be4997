"""Tiny random-weight encoder reward models (BERT, DeBERTa-v2) with their own WordPiece tokenizer.

Their tokenizer differs from the policy's byte-level BPE on purpose: the HF reward worker must decode
rollouts and re-tokenise them. Nothing is downloaded, and the same arguments give the same files.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    DebertaV2Config,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from megarl.protocol import Batch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = (
    "the a of and to in is it that was for on are with as they be at one have this from or by what we can "
    "answer question think step add sum plus minus times equals result correct wrong yes no final user "
    "assistant please solve number first second"
).split()

ENCODERS = {
    "bert": (BertConfig, {"type_vocab_size": 2}),
    # relative attention and a ContextPooler: a different head and attention than BERT's.
    "deberta-v2": (
        DebertaV2Config,
        {"relative_attention": True, "pos_att_type": ["c2p", "p2c"], "type_vocab_size": 0},
    ),
}


def wordpiece_vocab() -> dict[str, int]:
    """Specials, then single characters (and their `##` continuations), then whole words: any lower-case
    ASCII text tokenises without [UNK], and common words stay single tokens."""
    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    pieces = [*SPECIALS, *chars, *(f"##{c}" for c in chars if c.isalnum()), *sorted(set(_WORDS) - set(chars))]
    return {piece: i for i, piece in enumerate(pieces)}


def build_wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    """A lower-casing BERT-style WordPiece tokenizer: `[CLS] a [SEP]`, and pairs as `[CLS] a [SEP] b [SEP]`
    with token type 1 on the second text. The vocabulary is fixed (not trained), so every build is equal."""
    vocab = wordpiece_vocab()
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=128,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def build_tiny_encoder_rm(
    out_dir: str | Path, arch: str = "bert", num_labels: int = 1, seed: int = 0
) -> Path:
    """Write a tiny random `arch` *ForSequenceClassification (2 layers, hidden 64, 128 positions) and its
    tokenizer to `out_dir`. Weights are drawn wider than the default init so scores spread over O(1)."""
    config_cls, extra = ENCODERS[arch]
    tokenizer = build_wordpiece_tokenizer()
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,
        **extra,
    )
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def make_rollouts(
    policy_tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    responses: Sequence[str],
    ground_truth: Sequence[str] | None = None,
) -> Batch:
    """A rollout Batch in verl's schema: left-padded `prompts`, right-padded `responses` ending in EOS,
    `attention_mask` over both and `response_mask`; padding widths differ per row on purpose."""
    pad, eos = policy_tokenizer.pad_token_id, policy_tokenizer.eos_token_id
    prompt_ids = [policy_tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    response_ids = [policy_tokenizer(r, add_special_tokens=False)["input_ids"] + [eos] for r in responses]
    width_p, width_r = max(map(len, prompt_ids)) + 1, max(map(len, response_ids)) + 2
    rows_p = torch.tensor([[pad] * (width_p - len(ids)) + ids for ids in prompt_ids])
    rows_r = torch.tensor([ids + [pad] * (width_r - len(ids)) for ids in response_ids])
    mask_p = torch.tensor([[0] * (width_p - len(ids)) + [1] * len(ids) for ids in prompt_ids])
    mask_r = torch.tensor([[1] * len(ids) + [0] * (width_r - len(ids)) for ids in response_ids])
    tensors = {
        "prompts": rows_p,
        "responses": rows_r,
        "attention_mask": torch.cat([mask_p, mask_r], dim=1),
        "response_mask": mask_r,
    }
    non_tensors = {} if ground_truth is None else {"ground_truth": list(ground_truth)}
    return Batch(tensors, non_tensors)
