"""Rank code for test_agentic_rollout (one rank, the shared 1-rank launch): multi-turn rollouts on a real
vLLM engine (tiny Qwen2, random weights, temperature 1) with the chat templates of three families.

An environment (`ChattyUser`) answers every assistant turn with a user message for up to TURNS turns, so
every conversation has several turns whatever the random model says; a set of frequent stop tokens ends
turns early (on a token that is not the template's end-of-turn one, so the boundary must add it).

Checked against the engine's own record of every request (its input ids and the ids it produced):
the trained row is exactly the last request's input and output, every earlier request's input is a
prefix of the row, and the generated positions (response_mask 1) hold exactly the engine's outputs.
Checked against the template: the row's text equals the template's own render of the conversation.
Then a harness that rewrites history (Qwen3: the earlier turn's reasoning stripped) through the
endpoint's session backend: the conversation is split, not corrupted.
"""

from __future__ import annotations

import threading
import time

import torch

from megarl.agentic.chat_format import ChatFormat
from megarl.config.roles import rollout_spec
from megarl.config.schema import MegarlConfig
from megarl.protocol import Batch

PROMPT, RESPONSE, TURNS = 128, 128, 3
STOPS = list(range(300, 340))  # ids every family tokenizer has: ~4% of a random model's tokens stop a turn
QUESTIONS = ["what is two plus two", "name a colour", "say something long", "count to three"]


class ChattyUser:
    """A simulated user: a reward per turn (its number), done after TURNS turns."""

    def reset(self, sample: dict) -> None:
        self.turn = 0

    def step(self, action_text: str) -> tuple[str, float, bool]:
        self.turn += 1
        return f"say more about turn {self.turn}", float(self.turn), self.turn >= TURNS


def spec(model: str, tokenizer: str):
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.tokenizer_path, cfg.model.dtype = model, tokenizer, "fp32"
    cfg.data.max_prompt_length, cfg.data.max_response_length = PROMPT, RESPONSE
    r = cfg.rollout
    r.n, r.temperature, r.seed = 2, 1.0, 11
    r.kv_cache_memory_bytes, r.max_num_seqs, r.enforce_eager = 16 << 20, 16, True
    r.stop_token_ids = STOPS
    r.multi_turn.enable = True
    r.multi_turn.environment = f"{__file__}:ChattyUser"
    r.agent.default_agent_loop = "env_agent"
    return rollout_spec(cfg)


def prompt_batch(tokenizer) -> Batch:
    """Prompts as the dataset gives them: rendered ids (left-padded) and the raw messages."""
    raw = [[{"role": "user", "content": q}] for q in QUESTIONS]
    ids = [ChatFormat(tokenizer).prompt_ids(m) for m in raw]
    prompts = torch.zeros(len(raw), PROMPT, dtype=torch.long)
    mask = torch.zeros(len(raw), PROMPT, dtype=torch.long)
    for i, row in enumerate(ids):
        prompts[i, PROMPT - len(row) :] = torch.tensor(row)
        mask[i, PROMPT - len(row) :] = 1
    return Batch(
        {"prompts": prompts, "attention_mask": mask}, {"raw_prompt": raw, "ground_truth": ["x"] * len(raw)}
    )


def compare_with_engine(out: Batch, calls: dict) -> dict:
    """The comparator: each row against the engine's record of its conversation's requests."""
    bad: list[str] = []
    turns = []
    for row in range(len(out)):
        key = f"{row // 2}.{row % 2}/0"
        record = calls[key]
        turns.append(len(record))
        p = out["prompts"][row][out["attention_mask"][row, :PROMPT].bool()].tolist()
        length = int(out["attention_mask"][row, PROMPT:].sum())
        r = out["responses"][row, :length].tolist()
        tokens = p + r
        mask = out["response_mask"][row, :length].tolist()
        last_in, last_out = record[-1]
        if last_in + last_out != tokens:
            bad.append(f"row {row}: the trained tokens are not the last request's input and output")
        generated = []
        for k, (given, produced) in enumerate(record):
            if tokens[: len(given) + len(produced)] != given + produced:
                bad.append(f"row {row} turn {k}: the request is not a prefix of the trained tokens")
            generated += list(range(len(given) - len(p), len(given) - len(p) + len(produced)))
        if [i for i, m in enumerate(mask) if m] != generated:
            bad.append(f"row {row}: response_mask is not exactly the engine's outputs")
    return {"bad": bad, "turns": turns}


def compare_with_template(out: Batch, calls: dict, tokenizer) -> list[str]:
    """The text between the assistant turns of each row against the template's own render of the same
    conversation up to each turn (placeholder assistant contents, the environment's messages as the
    user's, the generation prompt): every turn
    boundary, user turn and assistant header the rollout appended is the template's, token for token in
    text. A turn that ended on the end-of-turn token carries it itself; one that did not (a stop token of
    the sampling, the budget) gets it in the appended text."""
    from megarl.agentic.chat_format import ChatFormat

    eot = ChatFormat(tokenizer).end_of_turn_id
    bad = []
    for row in range(len(out)):
        record = calls[f"{row // 2}.{row % 2}/0"]
        messages = [{"role": "user", "content": QUESTIONS[row // 2]}]
        pieces = [tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)]
        for k in range(1, len(record)):  # what the template puts between turn k-1's content and turn k
            messages += [
                {"role": "assistant", "content": f"CONTENT{k - 1}"},
                {"role": "user", "content": f"say more about turn {k}"},
            ]
            render = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            pieces.append(render.split(f"CONTENT{k - 1}")[1])
        tokens = out["input_ids"][row][out["attention_mask"][row].bool()].tolist()
        position, texts = 0, []
        for given, produced in record:  # the given ids before each turn, then the turn
            texts.append(tokenizer.decode(tokens[position : len(given)]))
            position = len(given) + len(produced) - (1 if produced and produced[-1] == eot else 0)
        for k, (text, piece) in enumerate(zip(texts, pieces)):
            if text != piece:
                bad.append(f"row {row}, before turn {k}: {text!r} is not the template's {piece!r}")
    return bad


def check_families(rollout, model: str, tokenizers: dict[str, str]) -> dict:
    from megarl.agentic.multi_turn import MultiTurnRollout
    from megarl.data.chat import load_tokenizer
    from megarl.rollout.colocate import engine_call

    res = {}
    for family, path in tokenizers.items():
        family_spec = spec(model, path)
        rollout.multi_turn = MultiTurnRollout(rollout.llm, family_spec, engine_call)
        tokenizer = load_tokenizer(family_spec.model)
        t0 = time.perf_counter()
        out = rollout.generate(prompt_batch(tokenizer), family_spec.rollout)
        captured = {"calls": rollout.multi_turn.last_calls}
        engine = compare_with_engine(out, captured["calls"])
        res[family] = {
            "seconds": time.perf_counter() - t0,
            "engine_mismatches": engine["bad"],
            "template_mismatches": compare_with_template(out, captured["calls"], tokenizer),
            "turns": engine["turns"],
            "num_turns": out["num_turns"].tolist(),
            "token_exact": out["token_exact"].tolist(),
            "turn_reward_sums": out["turn_rewards"].sum(1).tolist(),
            "given_tokens": int(
                ((out["response_mask"] == 0) & (out["attention_mask"][:, PROMPT:] == 1)).sum()
            ),
            "split_index": out["split_index"].tolist(),
        }
    return res


def check_split(rollout, model: str, qwen3_tokenizer: str) -> dict:
    """A harness that sends back its first reply without the reasoning: Qwen3's template then renders
    the history differently from the tokens generated, so the session splits the trajectory."""
    from megarl.agentic.conversation import Conversation
    from megarl.agentic.engine_driver import EngineDriver
    from megarl.agentic.multi_turn import MultiTurnRollout, turn_seed
    from megarl.agentic.sessions import SessionBackend
    from megarl.rollout.colocate import engine_call

    family_spec = spec(model, qwen3_tokenizer)
    multi = MultiTurnRollout(rollout.llm, family_spec, engine_call)
    driver = EngineDriver(rollout.llm, engine_call)
    stops = multi.format_for(None).stop_token_ids

    def params(turn: int, cap: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=1, temperature=1.0, max_tokens=min(cap, 12), seed=turn_seed(5, 0, turn), stop_token_ids=stops
        )

    convs = {s: Conversation(s, {}, driver, params, RESPONSE) for s in ("kept", "rewritten")}
    backend = SessionBackend(convs, multi.format_for, multi.decode, multi.encode, None)
    question = [{"role": "user", "content": QUESTIONS[0]}]
    done, res, errors = threading.Event(), {}, []

    def harness() -> None:
        try:
            for session in convs:
                first = backend.chat(session, question, None, None)
                reply = {"role": "assistant", "content": first.content or ""}
                if session == "rewritten":  # what the harness claims the model said: reasoning, then text
                    reply["content"] = "<think>\nplan it\n</think>\n\n" + reply["content"]
                backend.chat(session, [*question, reply, {"role": "user", "content": "and then"}], None, None)
                conv = convs[session]
                res[session] = {
                    "splits": len(conv.segments),
                    "exact": conv.traj.check_exact(driver.calls.get(conv.segment_key, [])),
                    "first_segment_exact": conv.segments[0].check_exact(driver.calls[f"{session}/0"])
                    if conv.segments
                    else None,
                    "prompt_kept": conv.traj.prompt_ids == (conv.segments or [conv.traj])[0].prompt_ids,
                }
        except BaseException as e:
            errors.append(repr(e))
        finally:
            done.set()

    thread = threading.Thread(target=harness)
    thread.start()
    driver.serve(done)
    thread.join()
    res["errors"] = errors
    return res


def main(argv: list[str]) -> dict:
    from megarl.rollout.vllm import VLLMRollout
    from tests.helpers.chat_families import FAMILIES, family_tokenizer

    model, workdir = argv
    tokenizers = {}
    for family in FAMILIES:
        path = f"{workdir}/{family}"
        family_tokenizer(family, out_dir=path)
        tokenizers[family] = path
    t0 = time.perf_counter()
    rollout = VLLMRollout(spec(model, tokenizers[FAMILIES[0]]))
    res = {"engine_start_s": time.perf_counter() - t0}
    res["families"] = check_families(rollout, model, tokenizers)
    res["split"] = check_split(rollout, model, tokenizers["qwen3"])
    rollout.close()
    return res
