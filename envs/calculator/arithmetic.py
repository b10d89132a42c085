"""A safe arithmetic evaluator: an AST walk over exact fractions (no ``eval``, bounded size and depth).

>>> evaluate("37*58")
Fraction(2146, 1)
>>> format_number(evaluate("(1+2)/4"))
'0.75'
>>> evaluate("__import__('os')")
Traceback (most recent call last):
...
toolgym.envs.calculator.arithmetic.ArithmeticError_: only numbers and + - * / // % ** ( ) are allowed
"""

from __future__ import annotations

import ast
from fractions import Fraction

MAX_CHARS = 500
MAX_DEPTH = 60
MAX_EXPONENT = 256
MAX_DIGITS = 200


class ArithmeticError_(ValueError):
    """The expression is not plain arithmetic, or is too large; the message says why."""


def _check_size(x: Fraction) -> Fraction:
    if len(str(abs(x.numerator))) > MAX_DIGITS or len(str(x.denominator)) > MAX_DIGITS:
        raise ArithmeticError_(f"the result has more than {MAX_DIGITS} digits")
    return x


def _walk(node: ast.AST, depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise ArithmeticError_("the expression is nested too deeply")
    if isinstance(node, ast.Expression):
        return _walk(node.body, depth + 1)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _walk(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _walk(node.left, depth + 1), _walk(node.right, depth + 1)
        op = node.op
        if isinstance(op, ast.Add):
            return _check_size(left + right)
        if isinstance(op, ast.Sub):
            return _check_size(left - right)
        if isinstance(op, ast.Mult):
            return _check_size(left * right)
        if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)):
            if right == 0:
                raise ArithmeticError_("division by zero")
            if isinstance(op, ast.Div):
                return _check_size(left / right)
            return Fraction(left // right) if isinstance(op, ast.FloorDiv) else _check_size(left % right)
        if isinstance(op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise ArithmeticError_(f"exponents must be whole numbers of at most {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise ArithmeticError_("division by zero")
            if abs(left.numerator) > 1 and len(str(abs(left.numerator))) * abs(int(right)) > MAX_DIGITS * 2:
                raise ArithmeticError_(f"the result has more than {MAX_DIGITS} digits")
            return _check_size(left ** int(right))
    raise ArithmeticError_("only numbers and + - * / // % ** ( ) are allowed")


def evaluate(expression: str) -> Fraction:
    """Evaluate plain arithmetic exactly. Raises ``ArithmeticError_`` with a readable reason."""
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/").replace(",", "")
    if not text:
        raise ArithmeticError_("the expression is empty")
    if len(text) > MAX_CHARS:
        raise ArithmeticError_(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ArithmeticError_(f"cannot parse {expression!r}") from exc
    return _walk(tree, 0)


def format_number(x: Fraction) -> str:
    """Integers exactly; other values as a decimal with up to 12 significant digits."""
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.12g}"
