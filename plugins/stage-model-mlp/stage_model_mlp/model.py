"""A fully connected network (a multilayer perceptron): its config and its forward graph.

One device, forward only, over the plan's ``b`` (examples per micro-batch: frames of
speech for the acoustic model of the presets).  Layout (what STAGE's strategies read):

* the input features ``[b, i]`` and the labels ``[b]``; hidden layer ``j`` (1..layers)
  writes ``[b, h{j}]``; the output layer the logits ``[b, C]`` over the classes, which
  end in a cross-entropy;
* each hidden layer is one ``g.layer`` (pipeline stages split on them), the output layer
  is outside the layers (the last stage);
* every layer's width has a name of its own, and ``graph.meta["tp_dims"]`` lists every
  other one (``h1``, ``h3``...), so under ``--tp`` the layers alternate column parallel
  (their outputs split) and row parallel (their inputs split, the partial sums
  all-reduced), as Megatron-LM runs a transformer's MLP.  The classes are ``C``, not
  the vocabulary's ``V``: tensor parallel splits them only where the alternation puts
  the output layer column parallel (an even number of hidden layers); with an odd number
  (the presets) the output layer is row parallel and any ``--tp`` dividing the widths
  works, whatever the number of classes (9304 senones divide by 8 only).

There is no sequence: a micro-batch is ``--micro-batch-size`` examples, and ``--seq-len``,
``--sp``, ``--cp`` and decode are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from stage_core.api import DTYPES, Graph, GraphBuilder, ModelConfig, UsageError, check_choice, check_int, check_str

#: hidden activations: the logistic sigmoid (the CD-DNN-HMM of Seide et al. 2011) or ReLU
ACTIVATIONS = ("sigmoid", "relu")


@dataclass(frozen=True)
class MLPConfig(ModelConfig):
    """``layers`` hidden layers of ``hidden`` units each with a bias and an activation,
    between ``inputs`` features and ``classes`` outputs (a softmax over the classes)."""

    SEQUENCE: ClassVar[str] = "none"

    name: str = "das2016-dnn"
    family: str = "mlp"
    inputs: int = 429
    hidden: int = 2048
    layers: int = 7
    classes: int = 9304
    activation: str = "sigmoid"
    dtype: str = "fp32"

    def __post_init__(self):
        check_str(self, "name")
        if self.family != "mlp":
            raise UsageError(f"MLPConfig family={self.family!r}: its family must be 'mlp'")
        check_int(self, "inputs", "hidden", "layers", "classes")
        check_choice(self, "activation", ACTIVATIONS)
        check_choice(self, "dtype", DTYPES)


def widths(c: MLPConfig) -> list[str]:
    """The chain of width dims: the input, each hidden layer's, the classes."""
    return ["i", *(f"h{j}" for j in range(1, c.layers + 1)), "C"]


def mlp_dims(c: MLPConfig) -> dict[str, int]:
    return {"i": c.inputs, **{f"h{j}": c.hidden for j in range(1, c.layers + 1)}, "C": c.classes}


def mlp_tp_dims(c: MLPConfig) -> tuple[str, ...]:
    """Every other width of the chain (each layer reads one width and writes the next): the
    layers alternate column parallel (writing a listed dim) and row parallel (reading one)."""
    return tuple(widths(c)[1::2])


def build_mlp(c: MLPConfig) -> Graph:
    g = GraphBuilder(c.name or c.family, dims=mlp_dims(c), dtype=c.dtype,
                     meta={"family": c.family, "layers": c.layers, "seq_len": None, "tp_dims": mlp_tp_dims(c)})
    x = g.input("features", ("b", "i"), dtype=g.dtype)
    labels = g.input("labels", ("b",))
    chain = widths(c)
    for j in range(1, c.layers + 1):
        with g.layer(j - 1, f"fc{j}"):
            w = g.param("weight", (chain[j], chain[j - 1]))
            x = g.einsum("bx,yx->by", x, w, bias=g.param("bias", (chain[j],)), name="linear")
            x = g.elementwise("sigmoid", x, name="sigmoid") if c.activation == "sigmoid" else g.kernel(
                "relu", x, name="relu")
    with g.scope("output"):
        w = g.param("weight", ("C", chain[-2]))
        logits = g.einsum("bx,vx->bv", x, w, bias=g.param("bias", ("C",)), name="linear")
    return g.finish(g.cross_entropy(logits, labels, name="loss"))
