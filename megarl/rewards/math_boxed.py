"""MATH-style answers (`lighteval/MATH` and kin): the last `\\boxed{...}` of the response, compared with the
ground truth after Hendrycks' answer normalisation (the `is_equiv` of the MATH paper, as verl uses it).

Normalisation removes spaces, `\\left`/`\\right`, `\\!`, degrees, `\\$`, `\\%` (a bare `%` stays) and
trailing `\\text{ units}`; writes `tfrac`/`dfrac` as `frac`, `\\frac12` as `\\frac{1}{2}`, `\\sqrt2` as
`\\sqrt{2}`, `3/4` as `\\frac{3}{4}` and `0.5` as `\\frac{1}{2}`; adds the 0 of `.5`; and drops a short `x =`
prefix. Where a step of it fails on a malformed answer (a second `\\text{ `, a `\\sqrt` or `\\frac` at the
end) the two answers are compared as written, as verl does. Only `\\boxed{...}` and `\\boxed x` answers count: an
answer in `\\fbox{...}` scores 0, as in verl (its `remove_boxed` accepts `\\boxed` only).
"""

from __future__ import annotations

from megarl.errors import MegarlError


def last_boxed_only_string(text: str) -> str | None:
    """The answer box of `text`: the part after its last `\\boxed ` (up to a `$`) when it has one, else its
    last `\\boxed{...}` (or, with no `\\boxed`, `\\fbox{...}`), braces balanced; None if none."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def remove_boxed(boxed: str) -> str | None:
    """The content of `\\boxed{content}` / `\\boxed content`; None for anything else (`\\fbox{...}` included)."""
    if "\\boxed " in boxed:
        return boxed[len("\\boxed ") :] if boxed.startswith("\\boxed ") else None
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[len("\\boxed{") : -1]
    return None


class _Malformed(MegarlError, ValueError):
    """A normalisation step that cannot read the answer: the answers are compared as written."""


def _fix_fracs(s: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1{b} -> \\frac{1}{b}; a braced \\frac{..} stays as written."""
    first, *parts = s.split("\\frac")
    out = first
    for part in parts:
        out += "\\frac"
        if not part:
            raise _Malformed("\\frac at the end")
        if part.startswith("{"):
            out += part
        elif len(part) < 2:
            return s
        elif part[1] != "{":
            out += f"{{{part[0]}}}{{{part[1]}}}{part[2:]}"
        else:
            out += f"{{{part[0]}}}{part[1:]}"
    return out


def _fix_a_slash_b(s: str) -> str:
    if len(s.split("/")) != 2:
        return s
    a, b = s.split("/")
    try:
        a_int, b_int = int(a), int(b)
    except ValueError:
        return s
    return f"\\frac{{{a_int}}}{{{b_int}}}" if s == f"{a_int}/{b_int}" else s


def _remove_right_units(s: str) -> str:
    if "\\text{ " in s:
        before, *after = s.split("\\text{ ")
        if len(after) != 1:
            raise _Malformed("more than one \\text{ ")
        return before
    return s


def _fix_sqrt(s: str) -> str:
    if "\\sqrt" not in s:
        return s
    parts = s.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        if not part:
            raise _Malformed("\\sqrt at the end")
        out += f"\\sqrt{{{part[0]}}}{part[1:]}" if part[0] != "{" else f"\\sqrt{part}"
    return out


def strip_string(s: str) -> str:
    """Hendrycks' normalisation of a MATH answer (see the module doc)."""
    for old, new in (
        ("\n", ""),
        ("\\!", ""),
        ("\\\\", "\\"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
    ):
        s = s.replace(old, new)
    s = _remove_right_units(s)
    s = s.replace("\\\\%", "").replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    if len(s.split("=")) == 2 and len(s.split("=")[0]) <= 2:  # "x = 5" -> "5"
        s = s.split("=")[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def is_equiv(a: str | None, b: str | None) -> bool:
    """Whether two answers are the same after normalisation (both None counts as equal, as in MATH)."""
    if a is None or b is None:
        return a is None and b is None
    try:
        return strip_string(a) == strip_string(b)
    except _Malformed:  # compared as written (the reference's fallback)
        return a == b


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer of the response equals the ground truth after normalisation."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    answer = remove_boxed(boxed)
    return 1.0 if answer is not None and is_equiv(answer, str(ground_truth)) else 0.0
