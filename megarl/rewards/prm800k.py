"""The PRM800K answer grader that verl's `numina_*` (prime_math) and `hiyouga/geometry3k` (mathruler) use.

An answer is right when (a) Hendrycks' MATH normalisation (`math_boxed`'s, with a bare `%` removed too and
a whole `\\text{...}` unwrapped) makes both strings equal, or (b) a second normalisation (units, `$`, `%`,
"million", mixed numbers, LaTeX read as plain text) makes them equal, or both are tuples/intervals of the
same shape whose elements are equal fractions as written, or equal under `sympy.simplify` of their
difference. Two variants differ as verl's two copies do: mathruler's (`geometry3k`) also drops spaces and
braces before comparing; prime_math's (`numina_*`) also drops the unit "liter".

Deviation (docs/verl-rewards.md): verl turns LaTeX into text with pylatexenc; megarl reads the forms answers
use (`\\frac`, `\\sqrt`, `\\pi`, `\\infty`, `\\cup`, `\\cdot`, `\\times`, `\\text`-like wrappers, `\\left`/
`\\right`, spacing commands, groups) itself and drops any other command, as pylatexenc drops commands it
does not know; a symbol pylatexenc knows beyond megarl's list (`\\delta`, `\\approx`, …) is dropped too.
"""

from __future__ import annotations

import re

from megarl.rewards import math_boxed

_BAD_SUBSTRINGS = ("^{", "^(")
_BAD_REGEXES = (r"\^[0-9]+\^", r"\^[0-9][0-9]+")
_TUPLE_CHARS = "()[]"
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
          "year", "foot", "feet", "inch", "yard")  # fmt: skip
_SYMBOLS = {
    "pi": "π", "infty": "∞", "cup": "∪", "cdot": "·", "times": "×", "le": "≤", "leq": "≤", "ge": "≥",
    "geq": "≥", "neq": "≠", "ne": "≠", "circ": "∘", "angle": "∠", "theta": "θ", "alpha": "α", "beta": "β",
    "gamma": "γ", "%": "%", "$": "$", "{": "{", "}": "}", "_": "_", "&": "&", "#": "#",
    ",": " ", ";": " ", ":": " ", " ": " ", "quad": " ", "qquad": " ", "!": "", "left": "", "right": "",
}  # fmt: skip
_WRAPPERS = ("text", "textbf", "textit", "mathrm", "mathbf", "mathit", "operatorname", "mbox", "boxed")


def _group(s: str, i: int) -> tuple[str, int]:
    """The argument starting at s[i] (a braced group or one character), and the index after it."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return "", i
    if s[i] != "{":
        if s[i] == "\\":
            m = re.match(r"\\([A-Za-z]+|.)", s[i:])
            assert m is not None
            return m.group(0), i + len(m.group(0))
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1 : j], j + 1
    return s[i + 1 :], len(s)


def latex_to_text(s: str) -> str:
    """LaTeX as plain text, the way pylatexenc writes the forms answers use (`\\frac{a}{b}` -> a/b,
    `\\sqrt{x}` -> √(x), `\\pi` -> π, groups lose their braces)."""
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            m = re.match(r"\\([A-Za-z]+|.)", s[i:])
            name = m.group(1) if m else ""
            i += len(name) + 1
            if name.isalpha():  # TeX reads the spaces after a command word as part of it
                while i < len(s) and s[i] == " ":
                    i += 1
            if name in ("frac", "dfrac", "tfrac"):
                num, i = _group(s, i)
                den, i = _group(s, i)
                out.append(f"{latex_to_text(num)}/{latex_to_text(den)}")
            elif name == "sqrt":
                if i < len(s) and s[i] == "[":
                    close = s.find("]", i)
                    i = close + 1 if close >= 0 else len(s)
                arg, i = _group(s, i)
                out.append(f"√({latex_to_text(arg)})")
            elif name in _WRAPPERS:
                arg, i = _group(s, i)
                out.append(latex_to_text(arg))
            elif name in _SYMBOLS:
                out.append(_SYMBOLS[name])  # any other command is dropped (its argument stays, as a group)
        elif c in "{}$":
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def normalize_mathd(answer: str) -> str:
    """PRM800K's copy of Hendrycks' normalisation (a string it cannot read comes back stripped)."""
    answer = answer.strip()
    try:
        m = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)
        if m is not None:
            answer = m.group("text").strip()
        return math_boxed.strip_string(answer.replace("\\%", "").replace("%", ""))
    except Exception:  # noqa: BLE001 - PRM800K compares a string it cannot normalise as written
        return answer


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _strip_commas(expr: str) -> str:
    """1,000,000 -> 1000000 (only commas before groups of three digits)."""
    while True:
        nxt = re.sub(r"(\d)(,)(\d\d\d)($|\D)", r"\1\3\4", expr)
        if nxt == expr:
            return nxt
        expr = nxt


def _str_is_int(s: str) -> bool:
    try:
        x = float(_strip_commas(s))
        return abs(x - round(x)) <= 1e-7
    except (ValueError, OverflowError):
        return False


def _is_frac(expr: str) -> bool:
    return bool(re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", expr))


def normalize(expr: str, *, mathruler: bool) -> str:
    """PRM800K's second normalisation (see the module doc for the two variants)."""
    m = re.search(r"^\\text\{(?P<text>.+?)\}$", expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNITS if mathruler else (*_UNITS, "liter"):
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    expr = re.sub(",\\\\! *", "", expr)
    if _is_float(expr) and _str_is_int(expr):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        text = latex_to_text(expr.replace("\\frac", " \\frac"))
        for old, new in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
            text = text.replace(old, new)
        expr = text.strip()
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", "\\1+\\2", expr)  # a mixed number: 7 3/4 -> 7+3/4
    if mathruler:
        expr = expr.replace(" ", "").replace("{", "").replace("}", "")
    expr = expr.lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _equal_under_sympy(truth: str, given: str) -> bool:
    expr = f"({truth})-({given})"
    letters = {ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()}
    if len(letters) > 2 or any(bad in expr for bad in _BAD_SUBSTRINGS):
        return False
    if any(re.search(bad, expr) for bad in _BAD_REGEXES):
        return False
    import sympy  # here: importing sympy takes about a second, which every reward worker would pay
    from sympy.parsing import sympy_parser

    try:
        parsed = sympy_parser.parse_expr(
            expr.replace("^", "**"),
            transformations=(
                *sympy_parser.standard_transformations,
                sympy_parser.implicit_multiplication_application,
            ),
        )
        return bool(sympy.simplify(parsed) == 0)
    except Exception:  # noqa: BLE001 - an expression sympy cannot read is not equal (as in PRM800K)
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_commas(expr)
    if not expr:
        return []
    if len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS:
        if all(ch not in expr[1:-1] for ch in _TUPLE_CHARS):
            return [elem.strip() for elem in expr[1:-1].split(",")]
    return [expr]


def grade_answer(given: str | None, truth: str, *, mathruler: bool) -> bool:
    """Whether `given` is `truth` under PRM800K's grader (module doc)."""
    if given is None:
        return False
    if normalize_mathd(truth) == normalize_mathd(given):
        return True
    truth_n, given_n = normalize(truth, mathruler=mathruler), normalize(given, mathruler=mathruler)
    if truth_n == given_n:
        return True
    if not given_n:
        return False
    truth_elems, given_elems = _split_tuple(truth_n), _split_tuple(given_n)
    if len(truth_elems) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False
    if len(truth_elems) != len(given_elems):
        return False
    for t, g in zip(truth_elems, given_elems, strict=True):
        if _is_frac(t) and _is_frac(g):
            ok = t == g
        elif _str_is_int(t) != _str_is_int(g):
            ok = False
        else:
            ok = _equal_under_sympy(t, g)
        if not ok:
            return False
    return True
