"""Hugging Face reward models, data-parallel in plain PyTorch: a sequence classifier or embedding similarity.

The reward model keeps its own tokenizer: each rollout is decoded to text with the policy tokenizer and
re-tokenised with the reward model's, so any `AutoModelForSequenceClassification` checkpoint (a DeBERTa
or BERT RM, a Llama RM, ...) scores any policy. Two kinds:

  classifier            rm_score = the classifier's logit (`label_index` when it has several labels).
                        The RM sees (prompt, response) as its tokenizer's text pair, or, when the RM
                        tokenizer has a chat template, as a user turn and an assistant turn rendered by it.
  embedding_similarity  rm_score = cosine similarity of the response and the `ground_truth` text, each
                        mean-pooled over its tokens and L2-normalised (the sentence-transformers recipe of
                        all-MiniLM-L6-v2 and its kin).

No megatron here: every rank of the group is a data-parallel rank holding the whole model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from megarl.controller.dispatch import Dispatch, register
from megarl.controller.worker import Worker
from megarl.distributed.platform import platform
from megarl.models import dtypes
from megarl.protocol import Batch

RewardKind = Literal["classifier", "embedding_similarity"]
KINDS = ("classifier", "embedding_similarity")

Encoding = dict[str, list[int]]


def decode_rollouts(batch: Batch, tokenizer: PreTrainedTokenizerBase) -> tuple[list[str], list[str]]:
    """(prompt texts, response texts) of a rollout batch, decoded with the policy tokenizer.

    The valid tokens are those of `attention_mask`: its first P columns cover `prompts` (or the prompt part
    of `input_ids`), the last R cover `responses`. Not `response_mask`: a multi-turn rollout zeroes tool
    outputs there, but the reward model should read them. Special tokens (EOS, chat markers) are dropped.
    """
    for key in ("responses", "attention_mask"):
        if key not in batch.tensors.keys():
            raise KeyError(
                f"a rollout batch needs {key!r}; tensor columns are {sorted(batch.tensors.keys())}"
            )
    responses, mask = batch["responses"], batch["attention_mask"].bool()
    p = mask.shape[1] - responses.shape[1]
    prompts = batch["prompts"] if "prompts" in batch.tensors.keys() else batch["input_ids"][:, :p]
    prompt_texts = [
        tokenizer.decode(ids[m], skip_special_tokens=True) for ids, m in zip(prompts, mask[:, :p])
    ]
    response_texts = [
        tokenizer.decode(ids[m], skip_special_tokens=True) for ids, m in zip(responses, mask[:, p:])
    ]
    return prompt_texts, response_texts


def reference_texts(batch: Batch) -> list[str]:
    """The reference answers: the `ground_truth` column, else verl's `reward_model` dicts' `ground_truth`."""
    if "ground_truth" in batch.non_tensors:
        return [str(x) for x in batch["ground_truth"]]
    if "reward_model" in batch.non_tensors and all(
        isinstance(x, dict) and "ground_truth" in x for x in batch["reward_model"]
    ):
        return [str(x["ground_truth"]) for x in batch["reward_model"]]
    raise KeyError(
        "embedding_similarity compares each response with its reference answer, but the batch has no "
        f"non-tensor 'ground_truth' column (nor 'reward_model' dicts with a 'ground_truth' key); "
        f"columns are {batch.keys()}"
    )


def chat_messages(batch: Batch, prompt_texts: Sequence[str]) -> list[list[dict[str, Any]]]:
    """The conversation before each response: verl's `raw_prompt` messages when present, else the decoded
    prompt as one user turn (it still carries the policy template's role words, which is the best text
    there is once only token ids are left)."""
    if "raw_prompt" in batch.non_tensors:
        return [list(messages) for messages in batch["raw_prompt"]]
    return [[{"role": "user", "content": text}] for text in prompt_texts]


def encode_for_classifier(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    responses: Sequence[str],
    max_length: int,
    conversations: Sequence[list[dict[str, Any]]] | None = None,
) -> list[Encoding]:
    """The reward model's unpadded inputs for each (prompt, response), at most `max_length` tokens.

    With a chat template the response becomes the assistant turn after `conversations` (default: the
    prompt as the user turn), and over-long inputs lose their oldest tokens: a decoder RM reads its score
    at the last token, which must stay the end of the response. Without one, the tokenizer's text-pair
    call builds e.g. `[CLS] prompt [SEP] response [SEP]` and `longest_first` trims the longer text.
    """
    if tokenizer.chat_template:
        if conversations is None:
            conversations = [[{"role": "user", "content": text}] for text in prompts]
        encodings = []
        for messages, response in zip(conversations, responses):
            chat = [*messages, {"role": "assistant", "content": response}]
            text = tokenizer.apply_chat_template(chat, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][-max_length:]
            encodings.append({"input_ids": ids, "attention_mask": [1] * len(ids)})
        return encodings
    columns = tokenizer(list(prompts), list(responses), truncation="longest_first", max_length=max_length)
    return [{k: columns[k][i] for k in columns.keys()} for i in range(len(prompts))]


def _micro_batches(
    tokenizer: PreTrainedTokenizerBase, encodings: Sequence[Encoding], size: int, dev: torch.device
) -> Iterator[dict[str, torch.Tensor]]:
    for start in range(0, len(encodings), size):
        padded = tokenizer.pad(list(encodings[start : start + size]), return_tensors="pt")
        yield {k: v.to(dev) for k, v in padded.items()}


@torch.no_grad()
def score_classifier(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    encodings: Sequence[Encoding],
    micro_batch_size: int = 8,
    label_index: int = 0,
) -> torch.Tensor:
    """[n] float32: the classifier's logit `label_index` for each encoded input, `micro_batch_size` at a time."""
    scores = [
        model(**inputs).logits[:, label_index].float().cpu()
        for inputs in _micro_batches(tokenizer, encodings, micro_batch_size, model.device)
    ]
    return torch.cat(scores) if scores else torch.zeros(0)


@torch.no_grad()
def embed_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_length: int,
    micro_batch_size: int = 8,
) -> torch.Tensor:
    """[n, hidden] float32 unit vectors: token states mean-pooled over the attention mask, L2-normalised."""
    encodings = [tokenizer(text, truncation=True, max_length=max_length) for text in texts]
    vectors = []
    for inputs in _micro_batches(tokenizer, encodings, micro_batch_size, model.device):
        hidden = model(**inputs).last_hidden_state.float()
        mask = inputs["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        vectors.append(F.normalize(pooled, p=2, dim=-1).cpu())
    return torch.cat(vectors) if vectors else torch.zeros(0, model.config.hidden_size)


def embedding_similarity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    references: Sequence[str],
    max_length: int,
    micro_batch_size: int = 8,
) -> torch.Tensor:
    """[n] float32 cosine similarity of each text with its reference (1 = same meaning, ~0 = unrelated)."""
    a = embed_texts(model, tokenizer, texts, max_length, micro_batch_size)
    b = embed_texts(model, tokenizer, references, max_length, micro_batch_size)
    return (a * b).sum(-1)


def effective_max_length(model_path: str | Path, tokenizer: PreTrainedTokenizerBase, max_length: int) -> int:
    """`max_length`, capped by the tokenizer's `model_max_length` and, for a sentence-transformers model, by
    the `max_seq_length` it was trained with (256 for all-MiniLM-L6-v2)."""
    limits = [max_length, tokenizer.model_max_length]
    config = Path(model_path) / "sentence_bert_config.json"
    if config.is_file():
        limits.append(json.loads(config.read_text()).get("max_seq_length", max_length))
    return int(min(limits))


def _check_mean_pooling(model_path: str | Path) -> None:
    config = Path(model_path) / "1_Pooling" / "config.json"
    if config.is_file():
        modes = {k for k, on in json.loads(config.read_text()).items() if k.startswith("pooling_mode") and on}
        if modes != {"pooling_mode_mean_tokens"}:
            raise ValueError(
                f"{model_path} is a sentence-transformers model pooled with {sorted(modes)}; "
                "embedding_similarity implements mean pooling only (pooling_mode_mean_tokens)"
            )


def load_reward_model(
    model_path: str | Path, kind: RewardKind = "classifier", dtype: str = "fp32", label_index: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model in eval mode on CPU, its own tokenizer), checked to fit `kind`."""
    if kind not in KINDS:
        raise ValueError(f"unknown reward model kind {kind!r}; use one of {KINDS}")
    torch_dtype = dtypes.torch_dtype(dtype)
    config = AutoConfig.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        raise ValueError(
            f"the tokenizer of {model_path} has no pad token, so inputs cannot be batched; "
            "set one (e.g. pad_token = eos_token) and save the tokenizer with the checkpoint"
        )
    if kind == "classifier":
        architectures = config.architectures or []
        if not any(a.endswith("ForSequenceClassification") for a in architectures):
            raise ValueError(
                f"{model_path} is a {' / '.join(architectures) or config.model_type + ' (no architectures)'} "
                "checkpoint, but the classifier reward expects a trained *ForSequenceClassification "
                "(e.g. DebertaV2ForSequenceClassification); loading it would add an untrained score head. "
                "For a sentence-embedding model use kind='embedding_similarity'"
            )
        if not 0 <= label_index < config.num_labels:
            raise ValueError(
                f"label_index={label_index} is out of range: {model_path} has num_labels={config.num_labels}"
            )
        model = AutoModelForSequenceClassification.from_pretrained(model_path, dtype=torch_dtype)
    else:
        _check_mean_pooling(model_path)
        model = AutoModel.from_pretrained(model_path, dtype=torch_dtype)
    return model.eval(), tokenizer


def score_batch(
    batch: Batch,
    policy_tokenizer: PreTrainedTokenizerBase,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    kind: RewardKind = "classifier",
    max_length: int = 512,
    micro_batch_size: int = 8,
    label_index: int = 0,
) -> torch.Tensor:
    """[b] float32 rewards of a rollout batch (the whole pipeline, in this process)."""
    prompts, responses = decode_rollouts(batch, policy_tokenizer)
    if kind == "embedding_similarity":
        references = reference_texts(batch)
        return embedding_similarity(model, tokenizer, responses, references, max_length, micro_batch_size)
    conversations = chat_messages(batch, prompts) if tokenizer.chat_template else None
    encodings = encode_for_classifier(tokenizer, prompts, responses, max_length, conversations)
    return score_classifier(model, tokenizer, encodings, micro_batch_size, label_index)


class HFRewardWorker(Worker):
    """One data-parallel rank of a Hugging Face reward model group (no megatron; the whole model per rank,
    or with `fsdp` its FSDP2 shard)."""

    def __init__(
        self,
        model_path: str,
        policy_tokenizer_path: str,
        kind: RewardKind = "classifier",
        max_length: int = 512,
        micro_batch_size: int = 8,
        label_index: int = 0,
        dtype: str = "fp32",
        fsdp: bool = False,
    ) -> None:
        super().__init__(layout_kwargs=None)
        if max_length <= 0 or micro_batch_size <= 0:
            raise ValueError(f"max_length={max_length} and micro_batch_size={micro_batch_size} must be > 0")
        self.kind, self.micro_batch_size, self.label_index = kind, micro_batch_size, label_index
        self.model, self.tokenizer = load_reward_model(model_path, kind, dtype, label_index)
        self.model.to(platform().device)
        if fsdp:  # every rank scores its share with 1/N of the weights (all ranks score the same batch count)
            from megarl.fsdp.model import shard_frozen

            self.model = shard_frozen(self.model)
        self.policy_tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer_path)
        self.max_length = effective_max_length(model_path, self.tokenizer, max_length)

    @register(Dispatch.DP_COMPUTE)
    def compute_rm_score(self, batch: Batch) -> Batch:
        """Batch with tensor `rm_scores` [b] float32, one reward per rollout of this rank's share."""
        scores = score_batch(
            batch,
            self.policy_tokenizer,
            self.model,
            self.tokenizer,
            self.kind,
            self.max_length,
            self.micro_batch_size,
            self.label_index,
        )
        return Batch(tensors={"rm_scores": scores})
