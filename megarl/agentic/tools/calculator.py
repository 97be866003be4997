"""The built-in `calculator` tool: exact arithmetic on integers (floats where an operand is one) by
walking the expression's syntax tree — no eval, no names, no calls; bounded so `9**9**9` is refused
at once instead of running for hours."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

__all__ = ["MAX_DIGITS", "MAX_EXPRESSION_CHARS", "SCHEMA", "calculate", "calculator"]

MAX_EXPRESSION_CHARS = 2000
MAX_DIGITS = 4000  # of any operand or result; below Python's int-to-str limit of 4300 digits
_LOG10_2 = math.log10(2)

SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly: integers, + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example (1234 * 5678) % 97"}},
            "required": ["expression"],
        },
    },
}

Number = int | float


def calculator(expression: str) -> str:
    """The tool: the value of `expression` as plain text ("29842", "3.5"); raises ValueError or
    ZeroDivisionError with a message the model reads."""
    value = calculate(expression)
    return str(value) if isinstance(value, int) else repr(value)


def calculate(expression: str) -> Number:
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression has {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None
    return _eval(tree.body)


def _digits(value: int) -> int:
    return int(abs(value).bit_length() * _LOG10_2) + 1


def _checked(value: Number) -> Number:
    if isinstance(value, int) and _digits(value) > MAX_DIGITS:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits; the limit is {MAX_DIGITS}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not a finite number")
    return value


def _divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b  # exact: 6/3 is 2, not 2.0
    return a / b


def _power(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
        digits = b * math.log10(abs(a))
        if digits > MAX_DIGITS:
            raise ValueError(f"{a}**{b} has about {digits:.3g} digits; the limit is {MAX_DIGITS}")
    if a == 0 and b < 0:
        raise ZeroDivisionError("zero to a negative power")
    try:
        result = a**b
    except OverflowError:
        raise ValueError(f"{a}**{b} is too large") from None
    if isinstance(result, complex):
        raise ValueError(f"{a}**{b} is not a real number")
    return result


_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _divide,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_SYMBOL = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}


def _eval(node: ast.expr) -> Number:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.FloorDiv | ast.Mod) and b == 0:
            raise ZeroDivisionError(f"{_SYMBOL[type(node.op)]} by zero")
        try:
            return _checked(_BINARY[type(node.op)](a, b))
        except OverflowError:
            raise ValueError("the result is too large for a float") from None
    allowed = "numbers, + - * / // % ** and parentheses"
    raise ValueError(f"`{ast.unparse(node)}` is not allowed; use only {allowed}")
