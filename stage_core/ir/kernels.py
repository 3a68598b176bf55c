"""FLOPs per element of the non-matmul kernels.

Counting rule: one FLOP per arithmetic operation or transcendental function applied
to one element (an exp, a tanh, a sqrt each count 1), as written in the usual
fused kernels; loads, stores, comparisons for masks and random-number generation
count 0.  Matmuls are not here: an einsum that contracts costs 2 FLOPs per
multiply-add of its index space.  These counts feed ``flops.other``; the published
formulas that tests compare against cover matmuls only.
"""

from __future__ import annotations

# forward, backward (per element of the tensor named in the comment)
ELEMENTWISE = {
    # y = x + z (per output element)
    "add": (1, 0),
    # y = x * z
    "mul": (1, 2),
    # tanh-GeLU: 0.5*x*(1+tanh(c*(x+0.044715*x^3)))
    # fwd: x^2, x^3, *0.044715, +x, *c, tanh, +1, *x, *0.5 = 9
    # bwd: dy * d/dx of the above, with tanh reused: 13
    "gelu": (9, 13),
    # bias + GeLU fused (Megatron bias_gelu): one more add each way
    "bias_gelu": (10, 14),
    # silu: x*sigmoid(x): exp, +1, reciprocal, * = 4; bwd: s*(1+x*(1-s)) * dy = 5
    "silu": (4, 5),
    # swiglu: silu(g) * u: 4 + 1; bwd: dg (5 + 1), du (1)
    "swiglu": (5, 7),
    # dropout: x * mask * 1/(1-p): 2; bwd the same
    "dropout": (2, 2),
    # bias + dropout + residual add: +bias, *mask, *scale, +residual
    "bias_dropout_add": (4, 2),
    # dropout + residual add
    "dropout_add": (3, 2),
    # rotary embedding: x*cos + rotate(x)*sin: 3; its transpose in backward: 3
    "rope": (3, 3),
    # scale by a constant
    "scale": (1, 1),
}

# softmax over one index (per element): max, sub, exp, sum, divide = 5 (+1 scale, +1 mask
# when fused as Megatron's scaled masked softmax); backward y*(dy - sum(dy*y)): 4
SOFTMAX = (7, 4)

# normalisations (per element of the input)
# layernorm fwd: sum, sub mean, square, sum, * rstd, * gamma, + beta = 7; bwd: 11
# rmsnorm fwd: square, sum, * rstd, * gamma = 4; bwd: 8
NORM = {"layernorm": (7, 11), "rmsnorm": (4, 8)}

# cross-entropy per logit: fwd max, sub, exp, sum = 4; bwd softmax - one-hot: 2
CROSS_ENTROPY = (4, 2)

# summing reductions: one add per input element
REDUCTION_SUM = 1

# Adam with fp32 master weights, per parameter element:
#   m = b1*m + (1-b1)*g                      3
#   v = b2*v + (1-b2)*g*g                    4
#   mhat = m / (1-b1^t); vhat = v / (1-b2^t) 2
#   p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)   6
#   bf16 copy of p                           0
ADAM_FLOPS = 15

# --------------------------------------------------------------------------- mixture of experts
# (appended for the MoE kernels: GraphBuilder.router, .dispatch, .combine)

# sigmoid: exp, +1, reciprocal = 3; bwd recomputes s from the saved input (3), then
# dy * s * (1 - s) (3)
ELEMENTWISE["sigmoid"] = (3, 6)

# Router scores, per element of the [tokens, E] logits (fwd, bwd):
#   softmax: max, sub, exp, sum, divide = 5 (no scale, no mask); bwd y*(dy - sum(dy*y)) = 4
#   sigmoid: exp, +1, reciprocal = 3; bwd dy * s * (1 - s) = 3 (s saved)
ROUTER_SCORE = {"softmax": (5, 4), "sigmoid": (3, 3)}
# Top-k selection, per score: one comparison per candidate in a single selection pass
# (fwd); backward scatters the k weight gradients into place (no arithmetic).
ROUTER_TOPK = (1, 0)
# Adding a per-expert selection bias before top-k (DeepSeek-V3's aux-loss-free
# balancing), per score; it does not touch the weights, so no backward.
ROUTER_SELECTION_BIAS = (1, 0)
# Renormalising the k selected weights to sum to one, per selected weight:
# fwd sum + divide = 2; bwd dw = (dy - sum(dy*y)) / sum: mul, sum, sub, divide ~ 3
ROUTER_TOPK_NORM = (2, 3)
# Scaling the selected weights by a constant (DeepSeek-V3's routed_scaling_factor)
ROUTER_SCALE = (1, 1)

# Dispatch is a copy of token rows into expert slots: 0 FLOPs.  Its backward sums the
# k slot gradients of each token row: k - 1 adds per element of the token rows.
# Combine: y = sum_j w_j * out_j over the k experts of a token: a multiply and an add
# per element of the k·tokens·h rows it combines (fwd 2).  Backward: d out_j = w_j * dy
# (1) and d w_j = sum_h dy * out_j (2), per element of the same k·tokens·h rows (3).
COMBINE = (2, 3)

# --------------------------------------------------------------------------- model families II
# (appended for Gemma, OLMo 2, Nemotron-H and Mamba-2)

# logit soft-capping y = c·tanh(x/c) (Gemma 2: attention scores and final logits):
# fwd divide, tanh, multiply = 3; bwd dy·(1 - (y/c)^2): divide, square, subtract, multiply = 4
SOFTCAP = (3, 4)
ELEMENTWISE["softcap"] = SOFTCAP
# geglu: gelu(g) * u (Gemma's MLP): tanh-GeLU 9 + 1; bwd dg = dy·u·gelu'(g): 1 + 13,
# du = dy·gelu(g): gelu recomputed 9 + 1 (tanh shared with gelu': 4 of the 9 remain) -> 14 + 5
ELEMENTWISE["geglu"] = (10, 19)
# squared ReLU relu(x)^2 (Nemotron-H's MLP): max, square = 2; bwd 2·relu(x)·dy: 2
ELEMENTWISE["relu2"] = (2, 2)
# Mamba-2's gated RMSNorm, rmsnorm(x·silu(z)) in one kernel (norm_before_gate=False):
# fwd silu 4 + multiply 1 + rmsnorm 4 = 9; bwd rmsnorm 8, then du -> dx = du·silu(z)
# (silu recomputed 4 + 1) and dz = du·x·silu'(z) (5 + 1): 8 + 5 + 6 = 19
NORM["gated_rmsnorm"] = (9, 19)

# --------------------------------------------------------------------------- state-space models
# (appended for Mamba-2: GraphBuilder.ssd_scan and .causal_conv1d; derivation in
# plugins/stage-model-ssm/README.md)

# Depthwise causal conv1d with bias and SiLU fused (causal_conv1d_fn), per output element:
# a multiply-add per tap (2 per tap); bias add and SiLU 1 + 4.  Backward recomputes the
# conv (2 per tap) and computes dx and dw (a multiply-add per tap each: 4 per tap);
# bias + SiLU recomputed (5), SiLU' times dy (5), dbias summed (1).
CONV_PER_TAP = (2, 6)
CONV_BIAS_SILU = (5, 11)

# The SSD chunked scan (Mamba-2 paper, Dao & Gu 2024, section 6), elementwise work per
# (token, head) beside its batched matmuls:
#   softplus(dt + dt_bias) 4 (add, exp, add 1, log), dA = dt·A 1, chunk cumsum 1
SSD_DT = (6, 12)
#   the decay mask of the diagonal blocks, per (token, head, key in its chunk):
#   segment-sum difference 1, exp 1, times C·Bᵀ 1, times dt 1
SSD_MASK = (4, 8)
#   per output element: scale the state contribution by exp(dA_cumsum) 1, add it to the
#   diagonal part 1, the skip D·x 2
SSD_OUT = (4, 8)
#   state passing, per state element and chunk: state = exp(dA_chunk)·state + new (2)
SSD_PASS = (2, 4)
# One decode token (selective_state_update), per state element: state·dA 1, dt·B·x 2 (the
# product and the add), ·C 1, the sum over the state 1
SSD_STATE_UPDATE = 5

# --------------------------------------------------------------------------- inference
# Greedy sampling of the next token: one comparison per logit in a single arg-max pass
# (as ROUTER_TOPK counts a selection).
SAMPLE = 1
