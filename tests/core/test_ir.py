"""The IR and autodiff against numbers computed by hand or published formulas."""

import pytest

from stage_core import sym
from stage_core.autodiff import differentiate, saved_activations
from stage_core.ir import GraphBuilder, MATMUL, Role
from stage_core.ir.ops import BACKWARD, FORWARD
from stage_core.testing import ToyConfig, build_toy


def matmul_chain():
    """x[m,k] @ A[k,n] @ B[n,p], summed to a scalar loss through a reduction."""
    g = GraphBuilder("chain", dims={"m": 3, "k": 4, "n": 5, "p": 6})
    x = g.input("x", ("m", "k"), dtype="bf16")
    a = g.param("A", ("k", "n"))
    b = g.param("B", ("n", "p"))
    y = g.einsum("mk,kn->mn", x, a, name="first")
    z = g.einsum("mn,np->mp", y, b, name="second")
    return g.finish(g.reduce_sum(z, "mp->m", name="loss"))


def test_matmul_chain_flops_by_hand():
    graph = matmul_chain()
    first, second, _ = graph.ops
    values = graph.dims
    # [3,4]x[4,5]: 3*4*5 = 60 multiply-adds = 120 FLOPs; [3,5]x[5,6]: 90 -> 180 FLOPs
    assert sym.evaluate(first.flops, values) == 120
    assert sym.evaluate(second.flops, values) == 180
    assert sym.evaluate(graph.total("matmul_flops", graph.forward_ops), values) == 300
    # bytes touched by the first: read 12 + 20 bf16 elements, write 15 -> 94 bytes
    assert sym.evaluate(first.bytes, values) == (12 + 20 + 15) * 2


def test_matmul_chain_backward_by_hand():
    train = differentiate(matmul_chain())
    values = train.dims
    bwd = {op.name: sym.evaluate(op.flops, values) for op in train.backward_ops if op.kind == "einsum"}
    # second: dY = dZ B^T (3x6x5) and dB = Y^T dZ (5x3x6): 180 each; first: the input x
    # needs no gradient, so only dA = x^T dY (4x3x5): 120
    assert bwd == {"second.bwd.dgrad": 180, "second.bwd.wgrad": 180, "first.bwd.wgrad": 120}


def test_backward_flops_are_twice_forward_for_every_einsum():
    train = differentiate(build_toy(ToyConfig()))
    values = dict(train.dims, b=2, s=32)
    checked = 0
    for op in train.forward_ops:
        if op.kind != "einsum":
            continue
        grads = [b for b in train.backward_ops if b.forward_op is op and b.kind == "einsum"]
        fwd = sym.evaluate(op.matmul_flops, values)
        bwd = sum(sym.evaluate(b.matmul_flops, values) for b in grads)
        # the first layer's inputs all need gradients here (the embedding is trained)
        assert bwd == 2 * fwd, op.name
        checked += 1
    assert checked == 2 * 6 + 1  # qkv, scores, context, out, fc1, fc2 per layer, and the head


def test_every_parameter_receives_a_gradient_and_adam_state():
    forward = build_toy(ToyConfig())
    train = differentiate(forward)
    assert set(train.grads) == set(forward.params)
    for p, g in train.grads.items():
        assert g.role is Role.GRADIENT and g.grad_of is p and g.shape == p.shape
        master, m, v = train.opt_state[p]
        assert [t.dtype for t in (master, m, v)] == ["fp32"] * 3
    adam = [op for op in train.optimizer_ops if op.fn == "adam"]
    assert len(adam) == len(forward.params)


def test_training_graph_is_acyclic_and_ordered():
    train = differentiate(build_toy(ToyConfig()))
    assert train.is_acyclic()
    nxg = train.to_networkx()
    assert nxg.number_of_nodes() == len(train.ops)
    train.check_order()  # every tensor produced before it is read
    phases = [op.phase for op in train.ops]
    assert phases.index(BACKWARD) > max(i for i, p in enumerate(phases) if p == FORWARD)


def test_model_state_is_16_bytes_per_parameter():
    """ZeRO paper (Rajbhandari et al. 2020): mixed-precision Adam keeps 2 + 2 + 12 bytes per parameter."""
    train = differentiate(build_toy(ToyConfig()))
    values = dict(train.dims, b=1, s=1)
    psi = sum(sym.evaluate(p.numel, values) for p in train.params)
    params = sum(sym.evaluate(p.nbytes, values) for p in train.params)
    grads = sum(sym.evaluate(g.nbytes, values) for g in train.grads.values())
    optimizer = sum(sym.evaluate(t.nbytes, values) for s in train.opt_state.values() for t in s)
    assert (params, grads, optimizer) == (2 * psi, 2 * psi, 12 * psi)


@pytest.mark.parametrize("s,h,a", [(32, 64, 4), (128, 256, 8)])
def test_saved_activations_of_a_gpt_layer_match_korthikanti(s, h, a):
    """Korthikanti et al. 2022, Table 2, no parallelism: s*b*h*(34 + 5*a*s/h) bytes per layer."""
    cfg = ToyConfig(layers=1, hidden=h, heads=a, ffn=4 * h, seq_len=s)
    train = differentiate(build_toy(cfg))
    b = 2
    values = dict(train.dims, b=b, s=s)
    kept = {t for op in train.forward_ops if op.layer == 0 for t in op.saved if t in set(saved_activations(train))}
    per_layer = sum(sym.evaluate(t.nbytes, values) for t in kept)
    assert per_layer == s * b * h * (34 + 5 * a * s // h)


def test_embedding_is_a_lookup_and_its_gradient_a_scatter_add():
    train = differentiate(build_toy(ToyConfig()))
    emb = next(op for op in train.forward_ops if op.kind == "embedding")
    assert emb.flops == 0 and emb.matmul_flops == 0
    scatter = [op for op in train.backward_ops if op.forward_op is emb and op.kind == "embedding"]
    assert [op.fn for op in scatter] == ["scatter_add"]
    values = dict(train.dims, b=2, s=32)
    # one add per element of the output gradient, b*s*h
    assert sym.evaluate(scatter[0].flops, values) == 2 * 32 * 64


def test_bad_einsum_is_refused_with_the_index_named():
    g = GraphBuilder("bad", dims={"m": 2, "k": 3})
    x = g.input("x", ("m", "k"), dtype="bf16")
    w = g.param("w", ("m", "m"))
    with pytest.raises(ValueError, match="index 'k' is k on one operand and m on w"):
        g.einsum("mk,kn->mn", x, w, name="oops")  # k is 3 on x but 2 on w


def test_matmul_kind_is_recorded():
    graph = matmul_chain()
    assert all(term[2] == MATMUL for op in graph.ops[:2] for term in op.flop_terms)
