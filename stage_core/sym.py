"""The one module that touches sympy.

Sizes are sympy expressions over named dims (``b``, ``s``, ``h`` ...), each a
positive-integer symbol.  Everything else in STAGE sees :func:`dim`, plain
expressions, and :class:`Evaluator`, which turns a batch of expressions into a
single compiled numeric function (``lambdify``) and evaluates it with exact Python
integers: no ``subs``/``evalf`` per configuration.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Iterable, Mapping, Sequence

import sympy as sp

Expr = sp.Expr
ONE = sp.Integer(1)


@lru_cache(maxsize=None)
def dim(name: str) -> sp.Symbol:
    """The size dim called ``name``: a positive-integer symbol, the same object per name."""
    if not name.isidentifier():
        raise ValueError(f"dim name {name!r} is not an identifier")
    return sp.Symbol(name, integer=True, positive=True)


def dims(names: str) -> tuple[sp.Symbol, ...]:
    """``dims("b s h")`` -> the three dims."""
    return tuple(dim(n) for n in names.split())


def expr(value) -> Expr:
    """An int, a dim name or an expression, as an expression."""
    if isinstance(value, sp.Basic):
        return value
    if isinstance(value, str):
        return dim(value)
    return sp.sympify(value)


def product(values: Iterable) -> Expr:
    out = ONE
    for v in values:
        out = out * expr(v)
    return out


def names_in(e: Expr) -> set[str]:
    return {s.name for s in expr(e).free_symbols}


def equal(a, b) -> bool:
    return sp.simplify(expr(a) - expr(b)) == 0


class Evaluator:
    """Evaluate many expressions at once, exactly, for any binding of their dims.

    Each expression is split once into integer-coefficient numerator and
    denominator polynomials; both lists are compiled together with ``lambdify``.
    Calling the evaluator with a mapping of dim name to int returns one exact int
    per expression, and raises ``ValueError`` naming the expression when a value is
    not a whole number (a size that does not divide).
    """

    def __init__(self, exprs: Sequence[Expr]):
        self.exprs = [expr(e) for e in exprs]
        symbols: set[sp.Symbol] = set()
        for e in self.exprs:
            symbols |= e.free_symbols
        self.symbols = sorted(symbols, key=lambda s: s.name)
        self.names = [s.name for s in self.symbols]
        nums, dens = [], []
        for e in self.exprs:
            n, d = sp.fraction(sp.together(e))
            nums.append(sp.expand(n))
            dens.append(sp.expand(d))
        self._trivial_den = all(d == 1 for d in dens)
        # modules=[{}] prints plain Python arithmetic: ints stay exact ints.
        self._num = sp.lambdify(self.symbols, nums, modules=[{}])
        self._den = None if self._trivial_den else sp.lambdify(self.symbols, dens, modules=[{}])

    def __call__(self, values: Mapping[str, int]) -> list[int]:
        missing = [n for n in self.names if n not in values]
        if missing:
            raise KeyError(f"no value for dim(s) {', '.join(missing)}")
        args = [int(values[n]) for n in self.names]
        nums = self._num(*args)
        if self._trivial_den:
            return [int(x) for x in nums]
        out = []
        for e, n, d in zip(self.exprs, nums, self._den(*args)):
            n, d = int(n), int(d)
            q, r = divmod(n, d)
            if r:
                raise ValueError(f"{e} = {n}/{d} is not a whole number for {dict(values)}")
            out.append(q)
        return out

    def fractions(self, values: Mapping[str, int]) -> list[Fraction]:
        """Every expression as an exact fraction (for sizes that need not be whole)."""
        args = [int(values[n]) for n in self.names]
        nums = self._num(*args)
        dens = [1] * len(nums) if self._trivial_den else self._den(*args)
        return [Fraction(int(n), int(d)) for n, d in zip(nums, dens)]


def exact_values(exprs: Sequence, values: Mapping[str, int]) -> list[int]:
    """Each expression's whole value at ``values``, by substitution (each distinct one once):
    for one binding of a few distinct expressions (a model's parameter sizes), far cheaper
    than compiling an :class:`Evaluator`.  Raises ``ValueError`` naming an expression that is
    not a whole number there, ``KeyError`` for a dim without a value."""
    bound = {dim(name): int(v) for name, v in values.items() if str(name).isidentifier()}
    seen: dict = {}
    out = []
    for e in exprs:
        got = seen.get(e)
        if got is None:
            x = sp.sympify(expr(e).xreplace(bound))  # (a function of the dims may give a plain int)
            if x.free_symbols:
                raise KeyError(f"no value for dim(s) {', '.join(sorted(s.name for s in x.free_symbols))}")
            if not x.is_Integer:
                raise ValueError(f"{e} = {x} is not a whole number for {dict(values)}")
            got = seen[e] = int(x)
        out.append(got)
    return out


def evaluate(e, values: Mapping[str, int]) -> int:
    """One expression, exactly (for tests and one-off numbers, not loops)."""
    return Evaluator([expr(e)])(values)[0]
