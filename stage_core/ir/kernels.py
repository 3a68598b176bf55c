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
