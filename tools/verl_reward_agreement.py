"""Score agreement of megarl's rule rewards with verl's `default_compute_score` on generated strings.

    PYTHONPATH=$PWD:/path/to/verl-0.9.1-site python tools/verl_reward_agreement.py [--pin tests/unit/rewards/verl_reward_cases.json]

Needs verl (the reference; megarl and its CI never import it). Prints the per-source table for
docs/verl-rewards.md and every disagreeing case; `--pin` writes a representative subset of the cases with
verl's scores, which tests/unit/rewards/test_verl_sources.py checks megarl against.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import random
import sys
from collections import defaultdict

MATH_TRUTHS = [
    "5",
    "-2",
    "\\frac{1}{2}",
    "\\frac{3}{4}",
    "0.5",
    "3/4",
    "\\sqrt{2}",
    "2\\sqrt{3}",
    "10\\%",
    "50",
    "x=3",
    "\\text{(A)}",
    "(1,2)",
    "90^\\circ",
    "\\$5",
    "5\\text{ cm}",
    "\\pi",
    "\\dfrac{7}{2}",
    "1,000",
    "\\infty",
    "\\{1,2\\}",
    "\\left(0,1\\right)",
    "\\tfrac12",
    ".25",
    "\\frac{\\sqrt{3}}{2}",
]


def math_variants(t: str) -> list[str]:
    """Ways a response may write the answer `t` (right, reformatted, or wrong)."""
    return [
        t,
        t.replace("\\frac", "\\dfrac"),
        t.replace("\\dfrac", "\\frac"),
        " ".join(t),
        f"x = {t}",
        t + "\\%",
        t.replace("\\", "\\\\"),
        t + "1",
        "\\left(" + t + "\\right)",
        t.replace("1", "7"),
        t + "\\text{ cm}\\text{ m}",
        t + "\\sqrt",
    ]


def math_cases() -> list[tuple[str, str, object]]:
    out = []
    for t in MATH_TRUTHS:
        for a in math_variants(t):
            for tpl in (
                "\\boxed{%s}",
                "The answer is $\\boxed{%s}$.",
                "\\fbox{%s}",
                "so \\boxed %s$ done",
                "%s",
                "\\boxed{0} then \\boxed{%s}",
                "\\boxed{%s",
                "\\boxed {%s}",
            ):
                out.append(("lighteval/MATH", tpl.replace("%s", a), t))
    out += [
        ("HuggingFaceH4/MATH-500", "\\boxed{5} or \\boxed 6$", "6"),
        ("DigitalLearningGmbH/MATH-lighteval", "\\fbox{5}", "5"),
    ]
    return out


DAPO_TRUTHS = ["5", "1000", "\\frac{1}{2}", "34", "-3", "2\\sqrt{3}", "\\text{B}", "1,000", "12", "0.75"]


def dapo_cases() -> list[tuple[str, str, object]]:
    out = []
    pad = "Let me think step by step. " * 15
    for t, source in zip(
        DAPO_TRUTHS, itertools.cycle(["math_dapo", "math", "aime2024", "aime_2025", "math_dapo_reasoning"])
    ):
        for a in (
            t,
            t.replace("\\frac", "\\dfrac"),
            f"${t}$",
            f"{t} degrees",
            f"x = {t}",
            f"\\boxed{{{t}}}",
            f"\\text{{{t}}}",
            t + "0",
            "1,000" if t == "1000" else t.replace(",", ""),
            f"{t}.",
            "the " + t,
        ):
            for tpl in (
                "Answer: %s",
                "answer:%s",
                "ANSWER :  %s\nmore text",
                "\\boxed{%s}",
                pad + "Answer: %s",
                "Answer: %s" + pad * 2,
                "So \\boxed{%s}" + " " * 120,
                "%s",
                "Answer: \nthen \\boxed{%s}",
            ):
                out.append((source, tpl.replace("%s", a), t))
    return out


def search_cases() -> list[tuple[str, str, object]]:
    out = []
    truths = [
        {"target": ["Paris"]},
        {"target": ["The Beatles", "Beatles"]},
        {"target": "1969"},
        {"target": ["New York City", "NYC"]},
    ]
    sources = [
        f"searchR1_{s}"
        for s in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
    ]
    for (i, g), a in itertools.product(
        enumerate(truths),
        ["Paris", "the beatles", "Beatles!", "1969.", "nyc", "New  York   city", "London", "an NYC"],
    ):
        for tpl in (
            "<answer>%s</answer>",
            "<think>x</think><answer> %s </answer>",
            "%s",
            "<answer>wrong</answer><answer>%s</answer>",
            "<answer>%s</answer>" * 11,
            "<answer>%s</answer>" + "</answer>" * 10,
            "<answer>%s",
        ):
            out.append((sources[(i + len(out)) % len(sources)], tpl.replace("%s", a), g))
    return out


NUMINA_TRUTHS = [
    "5",
    "\\frac{1}{2}",
    "0.5",
    "3/4",
    "10\\%",
    "(1,2)",
    "[0,1)",
    "\\{1,2\\}",
    "2\\pi",
    "\\sqrt{2}",
    "90^\\circ",
    "5 \\text{ cm}",
    "1,000",
    "(-\\infty, 3]",
    "x^2+1",
    "\\dfrac{7}{2}",
    "101_2",
    "\\$5",
    "2 and 3",
    "-4",
]
NUMINA_EQUIVALENTS = {
    "5": ["5.0", "\\frac{10}{2}", "5 \\text{ cm}"],
    "\\frac{1}{2}": ["0.5", "1/2", "\\dfrac12", "50\\%"],
    "0.5": ["\\frac{1}{2}", "1/2", "50\\%"],
    "3/4": ["0.75", "\\frac{3}{4}", "6/8"],
    "10\\%": ["10", "0.1", "10%"],
    "(1,2)": ["(1, 2)", "\\left(1,2\\right)", "(2,1)"],
    "[0,1)": ["[0, 1)", "Interval.Ropen(0, 1)", "(0,1)"],
    "\\{1,2\\}": ["1,2", "\\{2,1\\}", "{1, 2}"],
    "2\\pi": ["6.283", "2 \\pi", "6.28", "\\pi \\cdot 2"],
    "\\sqrt{2}": ["1.4142", "\\sqrt2", "2^{1/2}"],
    "90^\\circ": ["90", "90 degrees", "\\frac{\\pi}{2}"],
    "5 \\text{ cm}": ["5", "5cm", "50 mm"],
    "1,000": ["1000", "1000.0", "10^3"],
    "(-\\infty, 3]": ["(-\\infty,3]", "x \\le 3", "(-inf, 3]"],
    "x^2+1": ["1+x^2", "x**2+1", "(x+1)^2"],
    "\\dfrac{7}{2}": ["3.5", "7/2", "3 1/2"],
    "101_2": ["101", "5"],
    "\\$5": ["5", "\\$5.00", "5 dollars"],
    "2 and 3": ["2, 3", "3 and 2", "2 or 3"],
    "-4": ["- 4", "-4.0", "4"],
}


def numina_cases() -> list[tuple[str, str, object]]:
    out = []
    sources = itertools.cycle(
        [
            "numina_aops_forum",
            "numina_synthetic_math",
            "numina_amc_aime",
            "numina_synthetic_amc",
            "numina_cn_k12",
            "numina_olympiads",
        ]
    )
    for t in NUMINA_TRUTHS:
        for a in [t, *NUMINA_EQUIVALENTS[t], t + "1", t.replace("1", "7").replace("2", "9")]:
            for tpl in (
                "\\boxed{%s}",
                "The answer is %s",
                "Answer: %s",
                "%s",
                "So x = %s. Done",
                "Step 1: think. Step 2: \\fbox{%s}",
                "We get %s\nso the answer is",
            ):
                out.append((next(sources), tpl.replace("%s", a), t))
    return out


GEO_TRUTHS = [
    "5",
    "3\\sqrt{2}",
    "\\frac{1}{2}",
    "60",
    "12.5",
    "2\\pi",
    "\\frac{40}{3}",
    "8\\sqrt{3}",
    "24",
    "0.75",
]
GEO_EQUIVALENTS = {
    "5": ["5.0", "5 cm", "\\frac{10}{2}"],
    "3\\sqrt{2}": ["3 \\sqrt{2}", "\\sqrt{18}", "4.243"],
    "\\frac{1}{2}": ["0.5", "1/2", "\\dfrac{1}{2}"],
    "60": ["60^\\circ", "60 degrees", "60.0"],
    "12.5": ["25/2", "\\frac{25}{2}", "12.50"],
    "2\\pi": ["2 \\pi", "6.28", "2*pi"],
    "\\frac{40}{3}": ["13.33", "40/3", "13\\frac{1}{3}"],
    "8\\sqrt{3}": ["8 \\sqrt 3", "\\sqrt{192}", "13.86"],
    "24": ["24 \\text{ cm}^2", "24\\%", "{24}"],
    "0.75": ["3/4", "\\frac{3}{4}", "75\\%"],
}


def geometry3k_cases() -> list[tuple[str, str, object]]:
    out = []
    for t in GEO_TRUTHS:
        for a in [t, *GEO_EQUIVALENTS[t], t + "1", t.replace("2", "7").replace("5", "9").replace("4", "1")]:
            for tpl in (
                "<think>reason</think>\\boxed{%s}",
                "<think>a\nb</think> so \\boxed{%s}.",
                "\\boxed{%s}",
                "%s",
                "<think>x</think>%s",
                "<think>x</think>\\boxed{1} \\boxed{%s}",
                "\\boxed{%s",
                "<think>x \\boxed{%s}</think>",
            ):
                out.append(("hiyouga/geometry3k", tpl.replace("%s", a), t))
    return out


def latex_cases() -> list[tuple[str, str, object]]:
    """LaTeX forms that verl reads with pylatexenc, under both sources."""
    out = []
    latex = [
        ("\\sqrt[3]{2}", "\\sqrt{2}"),
        ("\\sqrt[3]{2}", "2^{1/3}"),
        ("\\theta", "\\theta"),
        ("30", "\\theta"),
        ("\\angle ABC", "\\angle{ABC}"),
        ("5", "\\mathbf{5}"),
        ("5", "\\textbf{5}"),
        ("5", "\\unknown{5}"),
        ("5", "\\mathrm{5}\\,\\mathrm{m}"),
        ("\\frac{a+b}{c}", "(a+b)/c"),
        ("\\frac{a+b}{c}", "a+b/c"),
        ("4\\sqrt{2}", "\\sqrt{32}"),
        ("1", "\\sin^2 x + \\cos^2 x"),
        ("2", "\\left| -2 \\right|"),
        ("\\frac{\\pi}{3}", "\\dfrac{\\pi}{3}"),
        ("\\frac{\\pi}{3}", "60^\\circ"),
        ("12", "\\boxed{12}"),
        ("\\frac{1}{2}", "\\frac12"),
        ("x \\geq 2", "x \\ge 2"),
        ("3 \\times 4", "12"),
    ]
    for t, a in latex:
        for source, tpl in (
            ("hiyouga/geometry3k", "<think>x</think>\\boxed{%s}"),
            ("numina_olympiads", "\\boxed{%s}"),
        ):
            out.append((source, tpl.replace("%s", a), t))
    return out


STDIN_TESTS = json.dumps(
    {"inputs": ["2 3\n", "10 -4\n", "0 0\n", "7 8\n"], "outputs": ["5\n", "6\n", "0\n", "15\n"]}
)
FLOAT_TESTS = json.dumps({"inputs": ["2\n", "3\n"], "outputs": ["1.4142135\n", "1.7320508\n"]})
CALL_TESTS = json.dumps(
    {"fn_name": "add", "inputs": ["1\n2", "[1]\n[2]", "5\n-5"], "outputs": ["3", "[1, 2]", "0"]}
)
SOLUTION_TESTS = json.dumps({"fn_name": "twice", "inputs": ["3", '"ab"'], "outputs": ["6", '"abab"']})
LOOP_TESTS = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})


PINNED_STDIN = {"right", "right_main", "wrong", "half", "crash", "exit_after"}
PINNED_CODE: set[str] = set()  # the code cases the unit test runs (each runs a few processes)


def fence(code: str, text: str = "Here is my solution:\n") -> str:
    return f"{text}```python\n{code}\n```\nDone."


def code_cases(with_timeouts: bool) -> list[tuple[str, str, object]]:
    stdin = {
        "right": "a, b = map(int, input().split())\nprint(a + b)",
        "right_main": "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\n"
        "if __name__ == '__main__':\n    main()",
        "right_spaces": "a, b = map(int, input().split())\nprint('  ', a + b, '  ')\nprint()",
        "wrong": "a, b = map(int, input().split())\nprint(a - b)",
        "half": "a, b = map(int, input().split())\nprint(a + b if a > 1 else -1)",
        "crash": "raise ValueError('no')",
        "syntax": "print(",
        "no_output": "pass",
        "exit_after": "a, b = map(int, input().split())\nprint(a + b)\nimport sys\nsys.exit(1)",
        "write_no_newline": "import sys\na, b = map(int, input().split())\nsys.stdout.write(str(a + b))",
        "sys_stdin": "import sys\na, b = map(int, sys.stdin.read().split())\nsys.stdout.write(str(a + b) + '\\n')",
    }
    out = []
    for name, code in stdin.items():
        out.append(("codecontests", fence(code), STDIN_TESTS))
        if name in PINNED_STDIN:
            PINNED_CODE.add(fence(code))
        out.append(("apps", code, STDIN_TESTS))  # no fence: the whole response is the program
    first_extra = len(out)
    out += [
        ("codeforces", fence("print(f'{sqrt(int(input())):.7f}')"), FLOAT_TESTS),  # sqrt without import
        ("codeforces", fence("print(round(sqrt(int(input())), 2))"), FLOAT_TESTS),
        ("taco", fence("def add(a, b):\n    return a + b"), CALL_TESTS),
        ("taco", fence("def add(a, b):\n    return a - b"), CALL_TESTS),
        ("taco", fence("class Solution:\n    def twice(self, x):\n        return x * 2"), SOLUTION_TESTS),
        (
            "taco",
            fence(
                "class Solution:\n    def twice(self, x):\n        return x + x if isinstance(x, int) else x"
            ),
            SOLUTION_TESTS,
        ),
        ("taco", fence("def add(a, b):\n    return (a, b)"), CALL_TESTS),
        ("taco", fence("def add(a, b):\n    return a + b if a != 5 else 1"), CALL_TESTS),
        ("codecontests", fence("import os\nos._exit(0)"), STDIN_TESTS),
    ]
    if with_timeouts:
        out.append(("codecontests", fence("while True:\n    pass"), LOOP_TESTS))
    PINNED_CODE.update(text for _, text, _ in out[first_extra:])
    return out


def verl_score(source, text, truth):
    from verl.utils.reward_score import default_compute_score

    with contextlib.redirect_stdout(io.StringIO()):
        r = default_compute_score(source, text, truth)
    return float(r["score"]) if isinstance(r, dict) else float(r)


def megarl_score(source, text, truth):
    from megarl.rewards.registry import default_compute_score

    r = default_compute_score(source, text, truth)
    return float(r["score"]) if isinstance(r, dict) else float(r)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pin", help="write a representative subset of the cases, with verl's scores, here")
    ap.add_argument("--no-timeouts", action="store_true", help="skip the slow code case that loops forever")
    args = ap.parse_args()
    groups = {
        "MATH (lighteval/MATH, MATH-lighteval, MATH-500)": math_cases(),
        "math_dapo, math, math_dapo_reasoning, aime*": dapo_cases(),
        "searchR1_*": search_cases(),
        "codecontests, apps, codeforces, taco": code_cases(not args.no_timeouts),
        "numina_* (verl: prime_math)": numina_cases(),
        "hiyouga/geometry3k (verl: geo3k, mathruler)": geometry3k_cases(),
        "LaTeX forms, numina_olympiads and hiyouga/geometry3k": latex_cases(),
    }
    pinned, rng = [], random.Random(0)
    print("| sources | agree / total | verl's scores (value: count) |\n|---|---|---|")
    lines, deviations = [], []
    for group, cases in groups.items():
        agree = 0
        results = []
        seen: dict[float, int] = defaultdict(int)
        for source, text, truth in cases:
            v, m = verl_score(source, text, truth), megarl_score(source, text, truth)
            ok = abs(v - m) < 1e-9
            agree += ok
            seen[v] += 1
            results.append((source, text, truth, v))
            if not ok:
                deviations.append(f"{group}: {source} {text!r} truth={truth!r}: verl {v}, megarl {m}")
        counts = ", ".join(f"{k:g}: {c}" for k, c in sorted(seen.items()))
        lines.append(f"| {group} | {agree} / {len(cases)} | {counts} |")
        if group.startswith("code"):
            keep = [r for r in results if r[1] in PINNED_CODE]
        else:
            keep = rng.sample(results, min(60, len(results)))
        pinned += [
            {"data_source": s, "solution_str": t, "ground_truth": g, "verl_score": v} for s, t, g, v in keep
        ]
    print("\n".join(lines))
    print("\nDeviations:" if deviations else "\nNo deviations.")
    for d in deviations:
        print(" ", d)
    if args.pin:
        with open(args.pin, "w") as f:
            json.dump(pinned, f, indent=1, ensure_ascii=False)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
