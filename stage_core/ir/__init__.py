"""The symbolic IR: tensors, einsum-first ops, graphs, and the builder models use."""

from .builder import GraphBuilder
from .graph import CacheDecl, Graph
from .ops import BACKWARD, FORWARD, MATMUL, OPTIMIZER, OTHER, Op, parse_spec
from .tensor import DTYPE_BYTES, Role, Tensor

__all__ = ["BACKWARD", "CacheDecl", "DTYPE_BYTES", "FORWARD", "Graph", "GraphBuilder", "MATMUL", "OPTIMIZER", "OTHER", "Op",
           "Role", "Tensor", "parse_spec"]
