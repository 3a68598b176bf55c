"""Tasks are transformations of one forward graph.

A model plugin builds its forward graph once (ending in a loss); what follows it
depends on the task:

* ``train``: backward and the optimizer (:func:`stage_core.autodiff.differentiate`).
* ``prefill``: the forward pass over ``b`` prompts of ``s`` tokens.  Each tensor the
  model declared as cached (``GraphBuilder.cache``: attention keys and values, MLA's
  latent and rope key) is also written into the cache, a tensor of role ``cache`` with
  the sequence dim replaced by ``ctx`` (= s here).  Only the last token of each prompt
  goes through the LM head, and its next token is sampled greedily.  Attention is
  causal: its score FLOPs count half of the s x s matrix (FlashAttention's convention;
  the exact count s(s+1)/2 differs by 1/s).
* ``decode``: the same forward pass for ``s = 1`` new token per request.  Each cached
  tensor is appended to the cache of ``ctx`` entries (the new one included) and its
  readers read the whole cache, so attention spans ``ctx`` keys, all of them
  attended (no causal discount), and the cache reads count in the attention kernel's
  bytes.  The sampled token is what the next step embeds (``Graph.feedback``).

A recurrent state (``GraphBuilder.state``: a Mamba layer's SSM and conv states) is a cache
of a fixed size: prefill writes the state after the prompt's last token, and a decode
step reads and rewrites it in place, whatever the context.  Kernels whose decode step is
not the same kernel over one token (a chunked scan becomes a state update) are rewritten
by :data:`DECODE_KERNELS`.

Neither inference task has a backward, an optimizer, or dropout (it is the identity
at inference: a dropout kernel disappears, a fused dropout-add becomes an add).
"""

from __future__ import annotations

import dataclasses

import sympy as sp

from . import sym
from .errors import UsageError
from .ir import kernels
from .ir.builder import WINDOW_LETTER, flash_terms, window_letters
from .ir.graph import CacheDecl, Graph
from .ir.ops import OTHER, Op, parse_spec
from .ir.tensor import Role, Tensor

TRAIN, PREFILL, DECODE, SERVE = "train", "prefill", "decode", "serve"
#: every task ``--task`` accepts; serve runs prefill and decode on two groups of ranks
TASKS = (TRAIN, PREFILL, DECODE, SERVE)
#: the dim of a cache's sequence: tokens each request keeps (prefill: s)
CONTEXT = "ctx"

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def inference_graph(forward: Graph, task: str) -> Graph:
    """The ``prefill`` or ``decode`` graph of ``forward`` (a model graph ending in its loss)."""
    if task not in (PREFILL, DECODE):
        raise ValueError(f"task {task!r} is not an inference task ({PREFILL}, {DECODE})")
    if forward.loss is None:
        raise ValueError(f"graph {forward.name} has no loss: cannot find its LM head")
    return _Inference(forward, task).run()


def attention_scale(task: str):
    """The fraction of the query x key score matrix an inference task's attention computes."""
    return sp.Rational(1, 2) if task == PREFILL else sp.Integer(1)


class _Inference:
    def __init__(self, forward: Graph, task: str):
        self.f = forward
        self.task = task
        self.g = Graph(name=forward.name, params=list(forward.params), dims=dict(forward.dims),
                       meta={**forward.meta, "task": task}, registered=dict(forward.registered))
        self.swap: dict[Tensor, Tensor] = {}  # a tensor of the forward graph -> what inference reads instead
        self.declared = {c.tensor: c for c in forward.caches}
        self.readers = forward.consumers()

    def run(self) -> Graph:
        loss_ops = self.loss_ops()
        producer = self.f.producers()
        # the heads make the logits the losses read (an LM head; BERT's MLM and NSP heads)
        made = [op for op in loss_ops if (op.fn == "cross_entropy" or op is loss_ops[0])]
        if any(not op.inputs or op.inputs[0] not in producer for op in made):
            op = made[0]
            raise UsageError(f"--task {self.task}: the inference tasks sample from the logits a loss reads (an LM "
                             f"or classifier head); model {self.f.name}'s loss {op.name} reads no op's output; use "
                             f"--task train")
        heads = list(dict.fromkeys(producer[op.inputs[0]] for op in made))
        for op in self.f.ops:
            if op in loss_ops:
                continue
            if op in heads and self.task == PREFILL and self.f.caches:  # (a model that will decode next)
                self.last_token(op.inputs[0], op)
            self.copy(op)
            for t in op.outputs:
                if t in self.declared:
                    self.cache(self.declared[t], op)
        for head in heads:
            logits = self.swap.get(head.outputs[0], head.outputs[0])
            self.sample(logits, head, "sample" if len(heads) == 1 else f"{head.name}.sample")
        read = {t for op in self.g.ops for t in op.inputs}
        self.g.inputs = [t for t in self.f.inputs if t in read]  # the tokens; no labels
        self.g.check_order()
        return self.g

    def loss_ops(self) -> list[Op]:
        """The ops inference drops: the cross-entropies (the loss's op when there is none)
        and every op after them on the way to the loss (sums of several losses)."""
        producer = self.f.producers()
        first = [op for op in self.f.ops if op.fn == "cross_entropy"] or [producer[self.f.loss]]
        out = list(first)
        tainted = {t for op in first for t in op.outputs}
        for op in self.f.ops:
            if op not in out and any(t in tainted for t in op.inputs):
                out.append(op)
                tainted.update(op.outputs)
        return out

    # ------------------------------------------------------------------ copying ops
    def copy(self, op: Op) -> None:
        inputs = tuple(self.swap.get(t, t) for t in op.inputs)
        if op.fn == "dropout":  # the identity at inference
            self.swap[op.outputs[0]] = inputs[0]
            return
        if op.fn in ("dropout_add", "bias_dropout_add"):
            op = self.plain_add(op, inputs)
        else:
            changes = {}
            if op.block == "attn_core" and "flops_scale" in op.attrs and self.f.caches:  # (an encoder's stays whole)
                changes = self.recount_attention(op, inputs)
            if self.task == DECODE and op.fn in DECODE_KERNELS:
                changes = DECODE_KERNELS[op.fn](op)
            op = dataclasses.replace(op, inputs=inputs, outputs=self.reshaped(op, inputs), saved=(),
                                     forward_op=None, **changes)
        self.g.ops.append(op)

    def reshaped(self, op: Op, inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """``op``'s outputs, remade where a swapped input (a cache of ctx entries) changes a
        letter's size: a reader of the cache computes over every cached token."""
        if all(a is b for a, b in zip(inputs, op.inputs)):
            return op.outputs
        ins, outs = parse_spec(op.spec)
        sizes = {}
        for term, t in zip(ins, inputs):
            for letter, size in zip(term, t.shape):
                sizes.setdefault(letter, size)
        remade = []
        for term, t in zip(outs, op.outputs):
            shape = tuple(sizes.get(letter, size) for letter, size in zip(term, t.shape))
            if shape != t.shape:
                new = Tensor(t.name, shape, t.dtype, t.role, t.tags)
                self.swap[t] = new
                t = new
            remade.append(t)
        return tuple(remade)

    def plain_add(self, op: Op, inputs: tuple[Tensor, ...]) -> Op:
        """A fused (bias-)dropout-add without its dropout: an add of its inputs, no mask."""
        ins, outs = parse_spec(op.spec)
        out = op.outputs[0]
        adds = len(inputs) - 1  # x (+ bias) + residual
        return dataclasses.replace(
            op, fn="add" if adds == 1 else "bias_add", inputs=inputs, outputs=(out,),
            spec=f"{','.join(ins)}->{outs[0]}", flop_terms=((kernels.ELEMENTWISE["add"][0] * adds, outs[0], OTHER),),
            byte_terms=(), saved=(), forward_op=None, attrs=dict(op.attrs))

    def recount_attention(self, op: Op, inputs: tuple[Tensor, ...]) -> dict:
        """Attention FLOPs as the task computes them (see the module docstring): the flash
        kernel's terms anew (a window counts min(window, keys) keys, keys now the cache's);
        the classic scores and context einsums rescaled."""
        scale = attention_scale(self.task)
        attrs = {**op.attrs, "flops_scale": scale}
        if op.fn != "flash_attention":
            old = sp.nsimplify(op.attrs["flops_scale"])
            return {"attrs": attrs, "flop_terms": tuple((sp.nsimplify(c) * scale / old, lets, kind)
                                                        for c, lets, kind in op.flop_terms)}
        causal = self.task == PREFILL
        window = op.attrs.get("window")
        vd = "v" if op.attrs.get("separate_value_dim") else "d"
        attrs["causal_flops"] = causal
        return {"attrs": attrs, "flop_terms": tuple(flash_terms(vd, causal, window, op.attrs.get("softcap"))),
                "free_letters": window_letters(window, inputs[1].shape[1]) if window is not None else {}}

    # ------------------------------------------------------------------ what inference adds
    def cache(self, decl: CacheDecl, op: Op) -> None:
        """Write the step's entries of ``decl`` into its cache tensor (role ``cache``)."""
        x = self.swap.get(decl.tensor, decl.tensor)
        term = _LETTERS[: x.rank]
        if decl.seq_dim is None:  # a recurrent state: prefill writes it; decode's kernel rewrites it in place
            state = Tensor(decl.name, x.shape, x.dtype, Role.CACHE)
            self.g.ops.append(Op(
                name=decl.name, kind="fused", fn="cache_write", inputs=(x,), outputs=(state,), spec=f"{term}->{term}",
                byte_terms=((x.itemsize, term),) if self.task == PREFILL else ((0, term),), layer=op.layer,
                block="kv_cache", attrs={"cache": decl.name, "state": True}))
            self.g.caches.append(CacheDecl(decl.name, state, None))
            return
        new_letter = next(c for c in reversed(_LETTERS) if c not in term)
        out_term = term[: decl.seq_dim] + new_letter + term[decl.seq_dim + 1:]
        shape = list(x.shape)
        shape[decl.seq_dim] = sym.dim(CONTEXT)
        window = self.window_of_readers(decl.tensor)
        if window is not None:  # local attention keeps only its window (a rolling buffer)
            shape[decl.seq_dim] = window_letters(window, shape[decl.seq_dim])[WINDOW_LETTER]
        cache = Tensor(decl.name, tuple(shape), x.dtype, Role.CACHE)
        self.g.ops.append(Op(
            name=decl.name, kind="fused", fn="cache_write", inputs=(x,), outputs=(cache,), spec=f"{term}->{out_term}",
            byte_terms=((x.itemsize, term), (x.itemsize, term)),  # the new entries read and written; a copy
            layer=op.layer, block="kv_cache",
            # a split of the step's tokens (context parallel) is a split of the cache entries
            attrs={"cache": decl.name, "token_letters": term[decl.seq_dim], "slot_letter": new_letter}))
        self.g.caches.append(CacheDecl(decl.name, cache, decl.seq_dim))
        if self.task == DECODE:
            self.swap[decl.tensor] = cache

    def window_of_readers(self, t: Tensor) -> int | None:
        """The window of the local attention that reads ``t``, when every reader has one."""
        windows = {op.attrs.get("window") for op in self.readers.get(t, ())}
        return windows.pop() if len(windows) == 1 else None

    def last_token(self, hidden: Tensor, head: Op) -> None:
        """Prefill: only the last token of each prompt goes on to the LM head."""
        x = self.swap.get(hidden, hidden)
        if x.rank != 3:
            raise ValueError(f"LM head {head.name} reads {x.name} of rank {x.rank}; expected [b, s, h]")
        last = Tensor(f"{head.name}.last_token", (x.shape[0], sp.Integer(1), x.shape[2]), x.dtype, Role.ACTIVATION)
        self.g.ops.append(Op(
            name=last.name, kind="fused", fn="last_token", inputs=(x,), outputs=(last,), spec="bsh->bqh",
            byte_terms=((x.itemsize, "bqh"), (x.itemsize, "bqh")), whole=frozenset("s"), layer=head.layer,
            # with the prompt split (context parallel) the rank holding its last token shares it:
            # an all-gather of one row per rank, not the whole sequence
            attrs={"sharded_whole": {"s": (("all_gather", "bqh", x.itemsize),)}}))
        self.swap[hidden] = last

    def sample(self, logits: Tensor, head: Op, name: str = "sample") -> None:
        """Greedy sampling of each request's next token from ``logits`` [b, 1, V] (a
        classifier's [b, V]: its class)."""
        letters = "bsijlmnopqtuwxyz"[: logits.rank - 1]  # the token letters, as GraphBuilder names them
        tokens = Tensor(name, tuple(logits.shape[:-1]), "int64", Role.ACTIVATION)
        self.g.ops.append(Op(
            name=name, kind="fused", fn="sample", inputs=(logits,), outputs=(tokens,), spec=f"{letters}v->{letters}",
            # the whole vocabulary: a vocabulary-parallel head's logits are gathered first, as
            # vLLM and Megatron-LM gather them before sampling
            flop_terms=((kernels.SAMPLE, f"{letters}v", OTHER),), whole=frozenset("v"), layer=head.layer))
        embedding = next((op for op in self.f.ops if op.kind == "embedding"), None)
        if self.f.caches and embedding is not None and embedding.inputs[0] in self.f.inputs:
            self.g.feedback[tokens] = embedding.inputs[0]  # the next step embeds the sampled token


# --------------------------------------------------------------------------- decode steps of recurrent kernels
# (appended for Mamba-2's kernels, GraphBuilder.ssd_scan and .causal_conv1d)


def _ssd_state_update(op: Op) -> dict:
    """One token through the SSD scan is mamba_ssm's selective_state_update: per state
    element state·exp(dt·A) + dt·B·x and its product with C summed over the state
    (:data:`kernels.SSD_STATE_UPDATE`), dt's softplus per head, D·x per output; the state
    read and written in place (no matmul: the one-token scan is elementwise)."""
    x, dt, _a, b = op.inputs[:4]
    state = op.outputs[2]
    return {"fn": "ssd_state_update",
            "flop_terms": ((kernels.SSD_STATE_UPDATE, "bsgrpn", OTHER), (kernels.SSD_DT[0], "bsgr", OTHER),
                           (kernels.SSD_OUT[0], "bsgrp", OTHER)),
            "byte_terms": ((2 * x.itemsize, "bsgrp"), (dt.itemsize, "bsgr"), (2 * b.itemsize, "bsgn"),
                           (2 * state.itemsize, "bsgrpn"))}


def _conv_update(op: Op) -> dict:
    """One token through the causal conv is causal_conv1d_update: the same FLOPs per output,
    and its k − 1 previous inputs read from the conv state, which shifts by one."""
    x = op.inputs[0]
    ins, outs = parse_spec(op.spec)
    taps = op.attrs["taps"]
    return {"fn": "causal_conv1d_update",
            "byte_terms": (*op.byte_terms, (2 * x.itemsize * (taps - 1), outs[0]))}


#: kernel name -> the changes that make it a decode step's kernel (see the module docstring)
DECODE_KERNELS = {"ssd_scan": _ssd_state_update, "causal_conv1d": _conv_update}
