"""Digit tasks a tiny model learns in minutes on a CPU: short prompts, short answers checked exactly.

| task            | prompt (user turn) | answer  |
|-----------------|--------------------|---------|
| digits_sort     | sort 31594         | 13459   |
| digits_reverse  | reverse 31594      | 49513   |
| digits_add      | 47 + 38 =          | 85      |

Lists hold 3 to 5 digits, addends are 0–99. With the tiny tokenizer (digits split one per token) a
prompt is ≤ 20 tokens after the chat template and an answer ≤ 5 tokens plus EOS.

How hard they are for the tiny Llama (4 layers, hidden 128) after 300 SFT steps of 32 pairs (AdamW, lr
3e-3; measured once, greedy, 128 held-out prompts): digits_reverse 100%, digits_sort ≈ 59% (misplaced
repeats, wrong length), digits_add ≈ 1%. digits_sort is the one that leaves RL room to show a gain.
"""

from __future__ import annotations

import random
from collections.abc import Callable

Problem = tuple[str, str]  # (prompt text, answer)

MIN_DIGITS, MAX_DIGITS = 3, 5


def _digit_list(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(MIN_DIGITS, MAX_DIGITS)))


def sort_problem(rng: random.Random) -> Problem:
    digits = _digit_list(rng)
    return f"sort {digits}", "".join(sorted(digits))


def reverse_problem(rng: random.Random) -> Problem:
    digits = _digit_list(rng)
    return f"reverse {digits}", digits[::-1]


def add_problem(rng: random.Random) -> Problem:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return f"{a} + {b} =", str(a + b)


GENERATORS: dict[str, Callable[[random.Random], Problem]] = {
    "digits_sort": sort_problem,
    "digits_reverse": reverse_problem,
    "digits_add": add_problem,
}
