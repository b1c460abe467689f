"""Peer: jax-scalify 0.1.1 against scalify.torch.ScaledTensor on one small graph (an MLP matmul + bias +
gelu, a single-head causal attention, a LayerNorm, a log-softmax cross-entropy), on the references
tests/data/jax_scalify/make_reference.py generated once (JAX is never installed here).

The reference ran the graph op by op: each op's inputs are the ScaledArrays (data, scale) the
reference recorded before it, so here every op runs on exactly jax-scalify's inputs and one op's
difference does not move the next. For each op, either
  - both libraries define the rule the same way: the scales are equal and the data agree (bit for
    bit where both compute the same roundings; matmuls within both GEMMs' accumulation bound), or
  - the rules differ by design (docs/NUMERICS.md, "Choices that differ from jax-scalify"): the test
    asserts Scalify's documented scale and jax-scalify's recorded one, and the represented values
    agree, or
  - jax-scalify 0.1.1 cannot run the op (the reference's meta lists why): Scalify's documented rule.

Which assertion catches a changed rule: matmul's pow2 rounding (down -> up) moves q, k, v (contracting
32: sqrt 5.66 -> 4) and o (contracting 8: sqrt 2.83 -> 2); add's rounding moves h (0.125 sqrt(1.25));
softmax's 1/pow2(n) moves p; log_softmax's and cross-entropy's scale 1 move logp and loss.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import scalify  # noqa: F401  (before torch: scalify.torch warns otherwise)

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import scalify.torch as st  # noqa: E402
from scalify.torch import ScaledTensor  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[2] / "tests" / "data" / "jax_scalify" / "reference.npz"
U32 = 2.0**-24
T, D, H, C = 8, 16, 32, 16


def gamma(n):
    return n * U32 / (1 - n * U32)


@pytest.fixture(scope="module")
def ref():
    with np.load(REFERENCE, allow_pickle=False) as d:
        r = {k: d[k] for k in d.files}
    r["meta"] = json.loads(str(r["meta"]))
    return r


def scaled_input(ref, name):
    return ScaledTensor(torch.from_numpy(ref[f"{name}/data"].copy()), float(ref[f"{name}/scale"]))


def value(ref, name):
    return ref[f"{name}/data"].astype(np.float64) * float(ref[f"{name}/scale"])


def run(fn):
    """fn() under the scaled rules only: no op may fall back to unscaled float32."""
    before = st.unhandled_ops()
    out = fn()
    assert st.unhandled_ops() == before, "an op fell back to unscaled float32"
    assert isinstance(out, ScaledTensor)
    return out


def data(t):
    return t.data_tensor.detach().numpy()


def represented(t):
    return t.unscaled().detach().numpy().astype(np.float64)


# Matmuls: (output, lhs, rhs, transpose rhs). Same rule: Z_s = X_s Y_s pow2_down(sqrt(K)),
# Z_d = (X_d Y_d) / pow2_down(sqrt(K)). Both sides run an f32 GEMM in an order neither fixes: each
# within gamma(K) |X_d| |Y_d| of the exact product (Higham, Lemma 3.3), the division exact.
MATMULS = [("mm1", "x", "w1", False), ("q", "g", "wq", False), ("k", "g", "wk", False),
           ("v", "g", "wv", False), ("s", "q", "k", True), ("o", "p", "v", False),
           ("logits", "ln", "wo", False)]


@pytest.mark.parametrize("out,a,b,transpose", MATMULS, ids=[m[0] for m in MATMULS])
def test_matmul_scale_equal(ref, out, a, b, transpose):
    x, y = scaled_input(ref, a), scaled_input(ref, b)
    z = run(lambda: x @ (y.t() if transpose else y))
    assert z.scale == float(ref[f"{out}/scale"])
    xd, yd = ref[f"{a}/data"].astype(np.float64), ref[f"{b}/data"].astype(np.float64)
    yd = yd.T if transpose else yd
    k = xd.shape[1]
    rescale = float(ref[f"{out}/scale"]) / (float(ref[f"{a}/scale"]) * float(ref[f"{b}/scale"]))
    bound = 2 * gamma(k) * (np.abs(xd) @ np.abs(yd)) / rescale
    assert np.all(np.abs(data(z) - ref[f"{out}/data"]) <= bound)


def test_add_bias_scale_equal(ref):
    # Z_s = pow2_down(max(X_s, Y_s) sqrt(1 + (min/max)^2)); the data rescaled by powers of two: one rounding.
    h = run(lambda: scaled_input(ref, "mm1") + scaled_input(ref, "b1"))
    assert h.scale == float(ref["h/scale"]) == 2.0**-3
    np.testing.assert_array_equal(data(h), ref["h/data"])


def test_linear_is_matmul_then_add(ref):
    # F.linear (aten.addmm) has the matmul rule then the add rule: jax-scalify's x @ w1 + b1.
    y = run(lambda: F.linear(scaled_input(ref, "x"), scaled_input(ref, "w1").t(), scaled_input(ref, "b1")))
    assert y.scale == float(ref["h/scale"])
    # Both GEMMs' f32 accumulation (the order depends on the kernel), then the add's one rounding.
    xd, wd = ref["x/data"].astype(np.float64), ref["w1/data"].astype(np.float64)
    product_scale = float(ref["x/scale"]) * float(ref["w1/scale"])
    bound = (2 * gamma(xd.shape[1]) * (np.abs(xd) @ np.abs(wd)) * product_scale / float(ref["h/scale"])
             + 2 * gamma(1) * np.abs(ref["h/data"]))
    assert np.all(np.abs(data(y) - ref["h/data"]) <= bound)


@pytest.mark.parametrize("out,inp,c", [("g", "h", 0.5), ("ss", "s", 1.0 / np.sqrt(D))], ids=["g", "ss"])
def test_scalar_mul_scale_equal(ref, out, inp, c):
    # A power-of-two constant goes into the scale; the data are unchanged.
    z = run(lambda: scaled_input(ref, inp) * float(c))
    assert z.scale == float(ref[f"{out}/scale"]) == float(ref[f"{inp}/scale"]) * c
    np.testing.assert_array_equal(data(z), ref[f"{out}/data"])


def test_gelu_not_in_jax_scalify(ref):
    # jax-scalify 0.1.1 has no rule for tanh (nor erf): gelu raises NotImplementedError there.
    assert "tanh" in ref["meta"]["unsupported"]["gelu"]
    h = scaled_input(ref, "h")
    y = run(lambda: F.gelu(h, approximate="tanh"))
    # Scalify's rule (docs/SCALE_RULES.md): Y_s = X_s, Y_d = gelu(X_d X_s) / X_s; the data against
    # torch's own f32 gelu of the represented value (two f32 gelus: a few ulps).
    assert y.scale == h.scale
    expected = F.gelu(torch.from_numpy(value(ref, "h")).float(), approximate="tanh").numpy() / h.scale
    np.testing.assert_allclose(data(y), expected, rtol=8 * U32, atol=8 * U32 * np.abs(ref["h/data"]).max())


def test_causal_mask_not_in_jax_scalify(ref):
    # jax-scalify 0.1.1 makes the -inf constant a ScaledArray of scale inf: where(mask, x, -inf) has
    # scale inf and NaN data. Scalify: -inf has ANY scale, the output keeps x's scale.
    assert ref["meta"]["unsupported"]["masked_fill"].startswith("where(mask, x, -inf): scale inf")
    causal = torch.from_numpy(ref["causal"])
    sm = run(lambda: scaled_input(ref, "ss").masked_fill(~causal, float("-inf")))
    assert sm.scale == float(ref["ss/scale"]) == float(ref["sm/scale"])
    np.testing.assert_array_equal(data(sm), ref["sm/data"])  # the mask the reference applied by hand


def test_softmax_scale_differs(ref):
    # Scalify: Y_s = 1 / pow2(n) (probabilities average 1/n); jax-scalify: exp scale 1, the sum's
    # pow2_down(sqrt(n)), the division 1 / pow2_down(sqrt(8)) = 1/2.
    p = run(lambda: torch.softmax(scaled_input(ref, "sm"), -1))
    assert p.scale == 2.0**-3
    assert float(ref["p/scale"]) == 2.0**-1
    # Values: each side's exp within an ulp, a sum of T terms, a division: (T + 3) u each.
    expected = value(ref, "p")
    assert np.all(np.abs(represented(p) - expected) <= 2 * gamma(T + 3) * expected)


def test_layer_norm_scale_differs(ref):
    # Scalify: normalised data has unit variance, Y_s = 1 (times the weight's scale); jax-scalify's
    # mean, sub, mul, mean, sqrt and div give 2 here (sqrt keeps sqrt(scale), not a power of two in
    # general: 2.83 in the outside check). No affine on either side.
    o = scaled_input(ref, "o")
    ln = run(lambda: F.layer_norm(o, (D,)))
    assert ln.scale == 1.0
    assert float(ref["ln/scale"]) == 2.0
    # Values: both normalise rows of D: means and variances of D terms, a sqrt, a division. Each
    # side within (2D + 8) u of |x - mean| / std, eps included; the outputs are O(1) (|y| <= sqrt(D)).
    expected = value(ref, "ln")
    assert np.all(np.abs(represented(ln) - expected) <= 2 * gamma(2 * D + 8) * (np.abs(expected) + 1))


def test_log_softmax_scale_differs(ref):
    # Scalify: Y_s = 1 (log-probabilities are O(log n)); jax-scalify: log gives scale 1, then
    # shifted (the logits' scale 4) - lse (scale 1) by the add rule: pow2_down(4 sqrt(1 + 1/16)) = 4.
    logp = run(lambda: torch.log_softmax(scaled_input(ref, "logits"), -1))
    assert logp.scale == 1.0
    assert float(ref["logp/scale"]) == float(ref["logits/scale"]) == 4.0
    # Values: shifted = x - max exact (Sterbenz fails in general: within u |shifted|), exp within
    # an ulp, a sum of C terms, a log: each side within (C + 4) u (|shifted| + |lse|).
    x = value(ref, "logits")
    shifted = x - x.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    bound = 2 * gamma(C + 4) * (np.abs(shifted) + np.abs(lse))
    assert np.all(np.abs(represented(logp) - value(ref, "logp")) <= bound)


def test_cross_entropy_scale_differs(ref):
    # Scalify: the loss is an f32 value with scale 1 (the engine's fused cross-entropy); jax-scalify
    # composes log_softmax, mul by the one-hot, sum, div by T: it carries log_softmax's scale, 4.
    logits = scaled_input(ref, "logits")
    loss = run(lambda: F.cross_entropy(logits, torch.from_numpy(ref["target"])))
    assert loss.scale == 1.0
    assert float(ref["loss/scale"]) == 4.0
    # Values: T log-probabilities (each within (C + 4) u (|shifted| + |lse|), as above), their mean.
    x = value(ref, "logits")
    shifted = x - x.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    pick = (np.abs(shifted) + np.abs(lse))[np.arange(T), ref["target"]]
    bound = 2 * (gamma(C + 4) * pick.sum() / T + gamma(T + 1) * abs(value(ref, "loss")))
    assert abs(float(represented(loss)) - float(value(ref, "loss"))) <= bound


# --- Backward: each op's vjp on the reference's cotangent ("<step>/ct"), op by op ---------------


def op_grads(ref, step, fn, inputs):
    """The gradients of fn(*inputs) for the reference's cotangent of `step`, under scaled rules only."""
    xs = [ScaledTensor(torch.from_numpy(ref[f"{i}/data"].copy()), float(ref[f"{i}/scale"]), requires_grad=True)
          for i in inputs]
    ct = ScaledTensor(torch.from_numpy(ref[f"{step}/ct/data"].copy()), float(ref[f"{step}/ct/scale"]))
    before = st.unhandled_ops()
    grads = torch.autograd.grad(fn(*xs), xs, grad_outputs=ct)
    assert st.unhandled_ops() == before, "an op fell back to unscaled float32"
    assert all(isinstance(g, ScaledTensor) for g in grads)
    return dict(zip(inputs, grads))


def matmul_fn(transpose):
    return lambda a, b: a @ (b.t() if transpose else b)


# Matmul gradients: dX = G Y^T (contracting Y's columns), dY = X^T G (contracting X's rows); the same
# matmul rule both sides, so equal scales, data within both GEMMs' bound.
@pytest.mark.parametrize("out,a,b,transpose", MATMULS, ids=[m[0] for m in MATMULS])
def test_matmul_grad_scales_equal(ref, out, a, b, transpose):
    grads = op_grads(ref, out, matmul_fn(transpose), [a, b])
    g = ref[f"{out}/ct/data"].astype(np.float64)
    xd, yd = ref[f"{a}/data"].astype(np.float64), ref[f"{b}/data"].astype(np.float64)
    yd = yd.T if transpose else yd
    # d a = g @ y^T; d b = (x^T @ g), transposed back where b entered transposed.
    products = {a: (g, yd.T), b: (xd.T, g)}
    for name, (l, r) in products.items():
        key = f"{out}/d_{name}"
        assert grads[name].scale == float(ref[f"{key}/scale"]), key
        other = b if name == a else a
        rescale = float(ref[f"{key}/scale"]) / (float(ref[f"{out}/ct/scale"]) * float(ref[f"{other}/scale"]))
        bound = 2 * gamma(l.shape[1]) * (np.abs(l) @ np.abs(r)) / rescale
        bound = bound.T if (name == b and transpose) else bound
        assert np.all(np.abs(data(grads[name]) - ref[f"{key}/data"]) <= bound), key


def test_add_bias_grad_scales_equal(ref):
    # d mm1 = g (scale kept, data exact); d b1 = sum over T of g: the sum rule, pow2_down(sqrt(8)) = 2.
    grads = op_grads(ref, "h", lambda a, b: a + b, ["mm1", "b1"])
    assert grads["mm1"].scale == float(ref["h/d_mm1/scale"]) == float(ref["h/ct/scale"])
    np.testing.assert_array_equal(data(grads["mm1"]), ref["h/d_mm1/data"])
    assert grads["b1"].scale == float(ref["h/d_b1/scale"]) == 2 * float(ref["h/ct/scale"])
    g = ref["h/ct/data"].astype(np.float64)
    bound = 2 * gamma(T) * np.abs(g).sum(axis=0) / 2
    assert np.all(np.abs(data(grads["b1"]) - ref["h/d_b1/data"]) <= bound)


@pytest.mark.parametrize("out,inp,c", [("g", "h", 0.5), ("ss", "s", 0.25)], ids=["g", "ss"])
def test_scalar_mul_grad_scales_equal(ref, out, inp, c):
    grads = op_grads(ref, out, lambda a: a * c, [inp])
    assert grads[inp].scale == float(ref[f"{out}/d_{inp}/scale"]) == float(ref[f"{out}/ct/scale"]) * c
    np.testing.assert_array_equal(data(grads[inp]), ref[f"{out}/d_{inp}/data"])


def test_gradient_accumulation_scale_equal(ref):
    # g feeds q, k and v: its gradient is the sum of their three by the add rule, in jax-scalify's
    # (reverse) order v, k, q; each add one rounding of power-of-two-rescaled data.
    total = scaled_input(ref, "v/d_g") + scaled_input(ref, "k/d_g") + scaled_input(ref, "q/d_g")
    assert total.scale == float(ref["g/ct/scale"]) == 8.0
    np.testing.assert_array_equal(data(total), ref["g/ct/data"])


def test_softmax_grad_scale_differs(ref):
    # Scalify: dX_s = g_s / pow2(n) = 2 / 8; jax-scalify's composed vjp (mul, sum, sub, div) gives 1.
    grads = op_grads(ref, "p", lambda a: torch.softmax(a, -1), ["sm"])
    assert grads["sm"].scale == float(ref["p/ct/scale"]) / 8 == 0.25
    assert float(ref["p/d_sm/scale"]) == 1.0
    # Values p (g - sum p g): each side within (T + 3) u of (|g| + sum p |g|) p, p within (T + 3) u.
    p, g = value(ref, "p"), value(ref, "p/ct")
    bound = 2 * gamma(2 * T + 6) * p * (np.abs(g) + (p * np.abs(g)).sum(axis=-1, keepdims=True))
    assert np.all(np.abs(represented(grads["sm"]) - value(ref, "p/d_sm")) <= bound)


def test_layer_norm_grad_scale_differs(ref):
    # Scalify: dX_s = g_s / X_s (d norm / dx scales as 1 / sigma(x)) = 2^-2 / 2^-5 = 8; jax-scalify's
    # composed vjp (through sqrt, div, mean) gives 16.
    grads = op_grads(ref, "ln", lambda a: F.layer_norm(a, (D,)), ["o"])
    assert grads["o"].scale == float(ref["ln/ct/scale"]) / float(ref["o/scale"]) == 8.0
    assert float(ref["ln/d_o/scale"]) == 16.0
    # Values rstd (g - mean g - xhat mean(g xhat)): each side within (2D + 8) u of the magnitudes.
    x, g = value(ref, "o"), value(ref, "ln/ct")
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + 1e-5)
    xhat = xc * rstd
    mag = rstd * (np.abs(g) + np.abs(g).mean(-1, keepdims=True) + np.abs(xhat) * np.abs(g * xhat).mean(-1, keepdims=True))
    assert np.all(np.abs(represented(grads["o"]) - value(ref, "ln/d_o")) <= 2 * gamma(2 * D + 8) * mag)


def test_log_softmax_grad_scale_equal(ref):
    # Both: dX_s = g_s (log_softmax's local derivative is O(1)); values g - softmax sum g.
    grads = op_grads(ref, "logp", lambda a: torch.log_softmax(a, -1), ["logits"])
    assert grads["logits"].scale == float(ref["logp/d_logits/scale"]) == float(ref["logp/ct/scale"])
    x, g = value(ref, "logits"), value(ref, "logp/ct")
    sm = np.exp(x - x.max(-1, keepdims=True))
    sm /= sm.sum(-1, keepdims=True)
    bound = 2 * gamma(C + 4) * (np.abs(g) + sm * np.abs(g).sum(-1, keepdims=True))
    assert np.all(np.abs(represented(grads["logits"]) - value(ref, "logp/d_logits")) <= bound)


def test_nll_loss_scale_differs_grad_equal(ref):
    # The reference's loss step, -sum(onehot logp) / T, is torch's nll_loss. Forward: Scalify's loss
    # is f32 with scale 1, jax-scalify carries logp's scale 4. Backward: both -onehot g / T with
    # scale g_s / pow2(T) (jax-scalify: the scalar 1/T's scale), data -1 at the targets.
    target = torch.from_numpy(ref["target"])
    loss = run(lambda: F.nll_loss(scaled_input(ref, "logp"), target))
    assert loss.scale == 1.0 and float(ref["loss/scale"]) == 4.0
    terms = value(ref, "logp")[np.arange(T), ref["target"]]
    assert abs(float(represented(loss)) - float(value(ref, "loss"))) <= 2 * gamma(T + 1) * np.abs(terms).sum() / T
    grads = op_grads(ref, "loss", lambda a: F.nll_loss(a, target), ["logp"])
    assert grads["logp"].scale == float(ref["loss/d_logp/scale"]) == 2.0**-3
    np.testing.assert_array_equal(data(grads["logp"]), ref["loss/d_logp/data"])


def test_cross_entropy_grad_scale_equal(ref):
    # Scalify's fused cross-entropy backward against jax-scalify's log_softmax vjp of nll's gradient:
    # dX_s = pow2(1 / T) both; values (softmax - onehot) / T.
    logits = ScaledTensor(torch.from_numpy(ref["logits/data"].copy()), float(ref["logits/scale"]), requires_grad=True)
    loss = F.cross_entropy(logits, torch.from_numpy(ref["target"]))
    (grad,) = torch.autograd.grad(loss, [logits], grad_outputs=ScaledTensor(torch.ones(()), 1.0))
    assert grad.scale == float(ref["logp/d_logits/scale"]) == 2.0**-3
    x = value(ref, "logits")
    sm = np.exp(x - x.max(-1, keepdims=True))
    sm /= sm.sum(-1, keepdims=True)
    bound = 2 * gamma(C + 4) * (sm + np.eye(C)[ref["target"]]) / T
    assert np.all(np.abs(represented(grad) - value(ref, "logp/d_logits")) <= bound)


def test_every_step_compared(ref):
    # Each op the reference recorded is one of the tests above (the inputs aside).
    inputs = {"x", "w1", "b1", "wq", "wk", "wv", "wo"}
    compared = {m[0] for m in MATMULS} | {"h", "g", "ss", "sm", "p", "ln", "logp", "loss"}
    recorded = {k.split("/")[0] for k in ref if k.endswith("/scale") and k.count("/") == 1}
    assert recorded - inputs == compared
    # and each step's gradients (the tests above): its cotangent, one vjp per input.
    grads = {k.rsplit("/", 1)[0] for k in ref if k.endswith("/scale") and k.count("/") == 2}
    assert grads == {f"{s}/ct" for s in compared - {"sm"}} | {f"{s}/d_{i}" for s, i in
                     [(m[0], m[1]) for m in MATMULS] + [(m[0], m[2]) for m in MATMULS]
                     + [("h", "mm1"), ("h", "b1"), ("g", "h"), ("ss", "s"), ("p", "sm"), ("ln", "o"),
                        ("logp", "logits"), ("loss", "logp")]}
    assert set(ref["meta"]["unsupported"]) == {"gelu", "masked_fill"}
