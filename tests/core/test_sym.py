import pytest
import sympy as sp

from stage_core import sym


def test_dims_are_positive_integer_symbols_shared_by_name():
    h = sym.dim("h")
    assert h.is_integer and h.is_positive
    assert sym.dim("h") is h


def test_evaluator_is_exact_beyond_float_precision():
    b, s, h = sym.dims("b s h")
    ev = sym.Evaluator([b * s * h * h * 72, (b * s) / 2])
    big = 2**40 + 1
    out = ev({"b": big, "s": 2, "h": 3})
    assert out == [big * 2 * 9 * 72, big]  # exact ints, no float rounding
    assert all(isinstance(x, int) for x in out)


def test_evaluator_names_a_size_that_does_not_divide():
    h, t = sym.dims("h t")
    with pytest.raises(ValueError, match="not a whole number"):
        sym.Evaluator([h / t])({"h": 10, "t": 3})


def test_evaluator_needs_every_dim():
    with pytest.raises(KeyError, match="h"):
        sym.Evaluator([sym.dim("h") * 2])({})


def test_expressions_compile_once_to_python_arithmetic():
    # the compiled function is plain Python; no sympy objects in the result
    ev = sym.Evaluator([sp.Integer(3) * sym.dim("x")])
    assert type(ev({"x": 5})[0]) is int


def test_evaluator_fractions_are_exact_where_a_size_is_not_whole():
    from fractions import Fraction

    b, s = sym.dims("b s")
    ev = sym.Evaluator([b * s * 2 / 8, b * s])
    assert ev.fractions({"b": 1, "s": 1001}) == [Fraction(1001, 4), Fraction(1001)]
    with pytest.raises(ValueError, match="not a whole number"):
        ev({"b": 1, "s": 1001})
