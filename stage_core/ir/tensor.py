"""Tensors of the symbolic IR: a name, a shape of size expressions, a dtype, a role."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .. import sym

#: bytes per element of every dtype the IR knows
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int64": 8,
    "int32": 4,
    "u8": 1,  # dropout masks (Korthikanti et al. count one byte per element)
}


class Role(str, Enum):
    PARAMETER = "parameter"
    ACTIVATION = "activation"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    INPUT = "input"  # data fed to the step (token ids, labels)
    CACHE = "cache"  # kept per request between inference steps (a KV cache)


@dataclass(frozen=True, eq=False)
class Tensor:
    """A tensor of the graph. Identity is the object (two tensors may share a name).

    ``shape`` is a tuple of size expressions (sympy); ``tags`` carry facts that
    strategies match on (``"residual"``, ``"expert"``, ...); ``grad_of`` links a
    gradient to the tensor it is the gradient of.
    """

    name: str
    shape: tuple
    dtype: str
    role: Role
    tags: frozenset = field(default_factory=frozenset)
    grad_of: "Tensor | None" = None

    def __post_init__(self):
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"tensor {self.name}: unknown dtype {self.dtype!r}; known: {sorted(DTYPE_BYTES)}")
        object.__setattr__(self, "shape", tuple(sym.expr(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self):
        return sym.product(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self):
        return self.numel * self.itemsize

    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"Tensor({self.name}: {self.dtype}[{dims}] {self.role.value})"
