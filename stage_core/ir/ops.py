"""Ops of the symbolic IR.

Every op carries an index equation in einsum notation (``"bsh,hf->bsf"``), one
letter per dim of each input and output.  The equation is the whole story for
three things:

* costs: FLOPs are a sum of terms ``coeff * prod(size of letters)``; bytes
  touched a sum of terms ``bytes_per_element * prod(size of letters)``.  Sharding
  a letter over a mesh axis divides its size, so local costs follow from the same
  terms with local letter sizes.
* sharding propagation: a letter sharded on an input stays sharded on an output
  that has it; a letter missing from an output is reduced, linearly (a sum:
  the output becomes Partial) or not (it must be gathered first).
* autodiff: VJP rules build backward ops from the same letters.

Kinds: ``einsum``, ``elementwise``, ``reduction``, ``softmax``, ``norm``,
``embedding``, ``fused`` (a declared kernel such as flash attention or
cross-entropy), ``view`` (no kernel: split, concat, reshape) and ``optimizer``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import sym
from .tensor import Tensor

MATMUL = "matmul"
OTHER = "other"

FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"


def parse_spec(spec: str) -> tuple[list[str], list[str]]:
    """``"bsh,hf->bsf"`` -> (["bsh", "hf"], ["bsf"]); an empty operand is a scalar
    (``"bsh->"``: one scalar output; ``"->bs"``: one scalar input broadcast)."""
    if spec.count("->") != 1:
        raise ValueError(f"index equation {spec!r} must have one '->'")
    lhs, rhs = spec.split("->")
    ins = lhs.split(",")
    outs = rhs.split(",")
    for term in ins + outs:
        if len(set(term)) != len(term):
            raise ValueError(f"index equation {spec!r}: repeated letter in {term!r}")
        if not all(c.isalpha() for c in term):
            raise ValueError(f"index equation {spec!r}: letters only, got {term!r}")
    return ins, outs


@dataclass(eq=False)
class Op:
    """One kernel (or view) of the graph.

    ``flop_terms``: tuple of ``(coeff, letters, kind)``; FLOPs are
    ``sum(coeff * prod(size[l] for l in letters))``, kind "matmul" or "other".
    ``byte_terms``: tuple of ``(bytes_per_element, letters)``; bytes touched.
    ``linear_reduce``: letters that the op sums over (einsum contraction, sum
    reduction, an embedding's vocabulary): sharded, they make outputs Partial.
    ``whole``: letters the op needs whole (normalised or softmaxed over).
    ``partial_ok``: the op is a sum of its inputs, so all-Partial inputs give a
    Partial output.
    ``saved``: the forward tensors this op's backward reads (set by autodiff).
    ``free_letters``: sizes of letters no operand carries, for cost terms only (a
    local-attention window: the keys each query reads, ``Min(window, keys)``).
    """

    name: str
    kind: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    spec: str
    flop_terms: tuple = ()
    byte_terms: tuple = ()
    fn: str = ""
    linear_reduce: frozenset = frozenset()
    whole: frozenset = frozenset()
    partial_ok: bool = False
    phase: str = FORWARD
    layer: int | None = None
    block: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    saved: tuple[Tensor, ...] = ()
    forward_op: "Op | None" = None
    free_letters: dict = field(default_factory=dict)
    letter_sizes: dict = field(default_factory=dict)

    def __post_init__(self):
        ins, outs = parse_spec(self.spec)
        if len(ins) != len(self.inputs) or len(outs) != len(self.outputs):
            raise ValueError(
                f"op {self.name}: equation {self.spec!r} has {len(ins)} inputs and {len(outs)} outputs, "
                f"op has {len(self.inputs)} and {len(self.outputs)}"
            )
        sizes: dict[str, Any] = {}
        for term, t in zip(ins + outs, self.inputs + self.outputs):
            if len(term) != t.rank:
                raise ValueError(f"op {self.name}: {t.name} has {t.rank} dims, equation gives {term!r}")
            for letter, size in zip(term, t.shape):
                seen = sizes.get(letter)
                if seen is None:
                    sizes[letter] = size
                elif seen != size and not sym.equal(seen, size):
                    raise ValueError(
                        f"op {self.name}: index {letter!r} is {seen} on one operand and {size} on {t.name}"
                    )
        for letter, size in self.free_letters.items():
            if letter in sizes:
                raise ValueError(f"op {self.name}: free letter {letter!r} is also an index of an operand")
            sizes[letter] = sym.expr(size)
        self.letter_sizes = sizes
        if not self.byte_terms:
            self.byte_terms = tuple((t.itemsize, term) for term, t in zip(ins + outs, self.inputs + self.outputs))

    @property
    def is_kernel(self) -> bool:
        return self.kind != "view"

    def _sum_terms(self, terms, kind=None):
        total = sym.ONE * 0
        for term in terms:
            if kind is not None and term[2] != kind:
                continue
            total += sym.expr(term[0]) * sym.product(self.letter_sizes[c] for c in term[1])
        return total

    @property
    def flops(self):
        return self._sum_terms(self.flop_terms)

    @property
    def matmul_flops(self):
        return self._sum_terms(self.flop_terms, MATMUL)

    @property
    def other_flops(self):
        return self._sum_terms(self.flop_terms, OTHER)

    @property
    def bytes(self):
        total = sym.ONE * 0
        for nbytes, letters in self.byte_terms:
            total += sym.expr(nbytes) * sym.product(self.letter_sizes[c] for c in letters)
        return total

    def __repr__(self) -> str:
        return f"Op({self.name}: {self.kind}{'/' + self.fn if self.fn else ''} {self.spec} {self.phase})"
