"""scalify.torch.functional: the engine's own ops on torch tensors.

Each op against (1) the engine's own Python op (scalify.layer_norm, ...) on the same values and
output gradient: value and every input gradient bit for bit; (2) torch's op computed in float64
on the same (float32) inputs, within a forward-error bound derived for the op: a sum or dot
product of n terms is within gamma_n = n u / (1 - n u) of the sum of its terms' magnitudes
(u = 2^-24); elementwise ops add one rounding each; exp and tanh are allowed 2 ulp; an exp's
argument's absolute error becomes its output's relative error. The magnitudes are computed in
float64 from the inputs' absolute values."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import pytest

import scalify  # before torch: see scalify.torch's warning on torch's OpenMP spinning

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import scalify.torch.functional as SF  # noqa: E402

U = 2.0 ** -24
GEN = torch.Generator().manual_seed(44)
B, T, D, H = 2, 16, 32, 2


def randn(*shape: int, scale: float = 1.0) -> "torch.Tensor":
    return torch.randn(*shape, generator=GEN) * scale


def gamma(n: float) -> float:
    return n * U / (1 - n * U)


def through_torch(op: Callable[..., "torch.Tensor"], inputs: Sequence["torch.Tensor"], grad: "torch.Tensor"):
    xs = [t.clone().requires_grad_() for t in inputs]
    y = op(*xs)
    y.backward(grad)
    return y.detach(), [x.grad for x in xs]


def through_engine(op: Callable[..., scalify.Tensor], inputs: Sequence["torch.Tensor"], grad: "torch.Tensor"):
    xs = [scalify.Tensor(t.numpy(), requires_grad=True) for t in inputs]
    y = op(*xs)
    y.backward(grad.numpy())
    return np.asarray(y), [x.grad for x in xs]


def assert_equals_engine(mine, engine) -> None:
    (y, grads), (ey, egrads) = mine, engine
    np.testing.assert_array_equal(y.numpy(), ey)
    for g, eg in zip(grads, egrads):
        np.testing.assert_array_equal(g.numpy(), eg)


def assert_within(mine: "torch.Tensor", exact: "torch.Tensor", bound: "torch.Tensor", what: str) -> None:
    error = (mine.double() - exact).abs()
    worst = float((error / bound).max())
    assert worst <= 1, f"{what}: error {worst:.3g} x the bound"


def f64_grads(op: Callable[..., "torch.Tensor"], inputs: Sequence["torch.Tensor"], grad: "torch.Tensor"):
    xs = [t.double().requires_grad_() for t in inputs]
    y = op(*xs)
    y.backward(grad.double())
    return y.detach(), [x.grad for x in xs]


def test_matmul():
    a, b, g = randn(B, T, D), randn(D, 48), randn(B, T, 48)
    mine = through_torch(SF.matmul, [a, b], g)
    assert_equals_engine(mine, through_engine(scalify.matmul, [a, b], g))
    y64, (da64, db64) = f64_grads(torch.matmul, [a, b], g)
    y, (da, db) = mine
    A, Bm, G = a.double().abs(), b.double().abs(), g.double().abs()
    assert_within(y, y64, gamma(D) * (A @ Bm), "y")
    assert_within(da, da64, gamma(48) * (G @ Bm.t()), "da")
    assert_within(db, db64, gamma(B * T) * (A.reshape(-1, D).t() @ G.reshape(-1, 48)), "db")


def test_a_transposed_weight_is_the_engines_transpose():
    """wte.t() (a tied head) reaches the engine as the engine's transpose of the stored matrix:
    the value and the gradient of scalify.matmul(x, scalify.transpose(w, 0, 1))."""
    x, w, g = randn(B, T, D), randn(40, D), randn(B, T, 40)
    wt = w.clone().requires_grad_()
    xt = x.clone().requires_grad_()
    y = SF.matmul(xt, wt.t())
    y.backward(g)
    ey, (ex, ew) = through_engine(lambda a, b: scalify.matmul(a, scalify.transpose(b, 0, 1)), [x, w], g)
    np.testing.assert_array_equal(y.detach().numpy(), ey)
    np.testing.assert_array_equal(xt.grad.numpy(), ex)
    assert wt.grad.shape == w.shape
    np.testing.assert_array_equal(wt.grad.numpy(), ew)


def test_add_reduces_a_broadcast_gradient_as_the_engine():
    a, b, g = randn(B, T, D), randn(D), randn(B, T, D)
    mine = through_torch(SF.add, [a, b], g)
    assert_equals_engine(mine, through_engine(scalify.add, [a, b], g))
    y64, (_, db64) = f64_grads(torch.add, [a, b], g)
    y, (da, db) = mine
    assert_within(y, y64, U * y64.abs(), "y")  # one rounding
    assert torch.equal(da, g)
    assert_within(db, db64, gamma(B * T) * g.double().abs().sum((0, 1)), "db")


def layer_norm_terms(x, w, b):
    x64 = x.double()
    mu, var = x64.mean(-1, keepdim=True), x64.var(-1, unbiased=False, keepdim=True)
    rstd = (var + 1e-5).rsqrt()
    return (x64 - mu) * rstd, rstd


def test_layer_norm():
    x, w, b, g = randn(B, T, D, scale=3), 1 + 0.1 * randn(D), 0.1 * randn(D), randn(B, T, D)
    mine = through_torch(lambda *v: SF.layer_norm(*v, eps=1e-5), [x, w, b], g)
    assert_equals_engine(mine, through_engine(lambda *v: scalify.layer_norm(*v, eps=1e-5), [x, w, b], g))
    y64, (dx64, dw64, db64) = f64_grads(lambda *v: F.layer_norm(v[0], (D,), v[1], v[2], 1e-5), [x, w, b], g)
    y, (dx, dw, db) = mine
    xhat, rstd = layer_norm_terms(x, w, b)
    W, G = w.double().abs(), g.double().abs()
    # x-hat: the mean and variance sum D terms, rstd adds a few roundings: relative (2D + 8) u.
    n = 2 * D + 8
    assert_within(y, y64, gamma(n + 2) * (xhat.abs() * W + b.double().abs()), "y")
    gw = G * W  # dx = rstd (g w - mean(g w) - x-hat mean(g w x-hat)): each term's magnitude
    dx_scale = rstd * (gw + gw.mean(-1, keepdim=True) + xhat.abs() * (gw * xhat.abs()).mean(-1, keepdim=True))
    assert_within(dx, dx64, gamma(2 * n) * dx_scale, "dx")
    assert_within(dw, dw64, gamma(B * T + n) * (G * xhat.abs()).sum((0, 1)), "dw")
    assert_within(db, db64, gamma(B * T) * G.sum((0, 1)), "db")


def test_layer_norm_without_affine_and_bias_alone():
    x, w, g = randn(4, D), 1 + 0.1 * randn(D), randn(4, D)
    assert_equals_engine(through_torch(lambda v: SF.layer_norm(v), [x], g), through_engine(lambda v: scalify.layer_norm(v), [x], g))
    assert_equals_engine(through_torch(lambda v, p: SF.layer_norm(v, p), [x, w], g),
                         through_engine(lambda v, p: scalify.layer_norm(v, p), [x, w], g))
    with pytest.raises(ValueError, match="a bias needs a weight"):
        SF.layer_norm(x, None, w)


def test_gelu():
    x, g = randn(64, 64, scale=3), randn(64, 64)
    mine = through_torch(SF.gelu, [x], g)
    assert_equals_engine(mine, through_engine(scalify.gelu, [x], g))
    y64, (dx64,) = f64_grads(lambda v: F.gelu(v, approximate="tanh"), [x], g)
    y, (dx,) = mine
    x64 = x.double()
    c, a = math.sqrt(2 / math.pi), 0.044715
    z = c * (x64 + a * x64 ** 3)
    t, sech2 = torch.tanh(z), 1 - torch.tanh(z) ** 2
    # 0.5 x (1 + tanh(z)): z within 5u relative (|z| sech^2 z <= 0.45 carries it through tanh), tanh
    # within 2 ulp, three more roundings: |error| <= 0.5 |x| (2u + 5u 0.45 + u) + 3u |y|.
    assert_within(y, y64, 0.5 * x64.abs() * (3 + 2.25) * U + 3 * U * y64.abs() + 1e-45, "y")
    # dy/dx = 0.5 (1 + t) + 0.5 x sech^2(z) c (1 + 3 a x^2): each term within 16 roundings; t's
    # 2 ulp give 1 + t an absolute u and sech^2 = 1 - t^2 an absolute 6u (relative: unbounded
    # where sech^2 is tiny).
    slope = 0.5 * x64.abs() * c * (1 + 3 * a * x64 ** 2)
    term1, term2 = 0.5 * (1 + t), slope * sech2
    assert_within(dx, dx64, g.double().abs() * (gamma(16) * (term1 + term2) + 2 * U + 6 * U * slope) + 1e-45, "dx")


def test_gelu_erf_and_bad_approximation():
    x, g = randn(8, 8), randn(8, 8)
    assert_equals_engine(through_torch(lambda v: SF.gelu(v, approximate="none"), [x], g), through_engine(scalify.gelu_erf, [x], g))
    with pytest.raises(ValueError, match="approximate must be 'tanh' or 'none'"):
        SF.gelu(x, approximate="sigmoid")


def test_softmax():
    x, g = randn(64, 64, scale=3), randn(64, 64)
    mine = through_torch(SF.softmax, [x], g)
    assert_equals_engine(mine, through_engine(scalify.softmax, [x], g))
    y64, (dx64,) = f64_grads(lambda v: v.softmax(-1), [x], g)
    y, (dx,) = mine
    n = 64 + 6  # the row's sum, the exp's 2 ulp, the max subtraction, the division
    assert_within(y, y64, gamma(n) * y64, "y")
    G = g.double().abs()
    assert_within(dx, dx64, gamma(2 * n) * y64 * (G + (y64 * G).sum(-1, keepdim=True)), "dx")


def test_embedding():
    ids = torch.randint(0, 10, (B, T), generator=GEN)
    w, g = randn(10, D), randn(B, T, D)
    mine = through_torch(lambda v: SF.embedding(ids, v), [w], g)
    assert_equals_engine(mine, through_engine(lambda v: scalify.embedding(v, ids.numpy()), [w], g))
    y, (dw,) = mine
    assert torch.equal(y, w[ids])  # a gather: exact
    dw64 = torch.zeros(10, D, dtype=torch.float64).index_add_(0, ids.reshape(-1), g.double().reshape(-1, D))
    count = torch.bincount(ids.reshape(-1), minlength=10).double()[:, None]
    scale = torch.zeros(10, D, dtype=torch.float64).index_add_(0, ids.reshape(-1), g.double().abs().reshape(-1, D))
    assert_within(dw, dw64, gamma(count) * scale + 1e-45, "dw")


def reference_attention(qkv):
    q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in qkv.split(D, 2))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    p = ((q @ k.transpose(-1, -2)) / math.sqrt(D // H)).masked_fill(~mask, float("-inf")).softmax(-1)
    return (p @ v).transpose(1, 2).reshape(B, T, D), p, q, k, v


def test_causal_self_attention():
    qkv, g = randn(B, T, 3 * D), randn(B, T, D)
    mine = through_torch(lambda v: SF.causal_self_attention(v, H), [qkv], g)
    assert_equals_engine(mine, through_engine(lambda v: scalify.causal_self_attention(v, H), [qkv], g))
    y64, (dqkv64,) = f64_grads(lambda v: reference_attention(v)[0], [qkv], g)
    y, (dqkv,) = mine
    _, p, q, k, v = reference_attention(qkv.double())
    hd = D // H
    # A score is a dot product of hd terms: absolute error gamma(hd) |q||k| / sqrt(hd), which the
    # exp turns into the probabilities' relative error, with the softmax's own (T + 6) u.
    score_error = gamma(hd + 2) * (q.abs() @ k.abs().transpose(-1, -2)) / math.sqrt(hd)
    p_rel = 2 * score_error.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), 0).amax(-1, keepdim=True) + gamma(T + 6)
    heads = lambda t: t.transpose(1, 2).reshape(B, T, D)  # noqa: E731
    assert_within(y, y64, heads((p_rel + gamma(T)) * (p @ v.abs())), "y")
    # The backward on magnitudes: dv = p^T g, dp = g v^T, ds = p (dp - rowsum(p dp)), dq = ds k, dk = ds^T q.
    G = g.double().view(B, T, H, hd).transpose(1, 2).abs()
    dp = G @ v.abs().transpose(-1, -2)
    ds = p * (dp + (p * dp).sum(-1, keepdim=True))
    scale = torch.cat([heads(ds @ k.abs() / math.sqrt(hd)), heads(ds.transpose(-1, -2) @ q.abs() / math.sqrt(hd)),
                       heads(p.transpose(-1, -2) @ G)], dim=2)
    assert_within(dqkv, dqkv64, (2 * p_rel.max() + gamma(2 * (T + hd) + 12)) * scale + 1e-45, "dqkv")


def test_cross_entropy():
    logits, targets = randn(64, 50, scale=3), torch.randint(0, 50, (64,), generator=GEN)
    one = torch.tensor(1.0)
    mine = through_torch(lambda v: SF.cross_entropy(v, targets), [logits], one)
    assert_equals_engine(mine, through_engine(lambda v: scalify.cross_entropy(v, targets.numpy()), [logits], one))
    y64, (dl64,) = f64_grads(lambda v: F.cross_entropy(v, targets), [logits], one)
    y, (dl,) = mine
    L = logits.double()
    m = L.amax(-1)
    lse = m + (L - m[:, None]).exp().sum(-1).log()
    # Per row: log-sum-exp within (V + 6) u of its magnitudes, then a mean of 64 rows.
    row = gamma(50 + 6) * (m.abs() + lse.abs() + L.gather(1, targets[:, None])[:, 0].abs())
    assert_within(y, y64, row.mean() + gamma(64) * (lse - L.gather(1, targets[:, None])[:, 0]).abs().mean(), "loss")
    # (softmax - one-hot) / 64: exp(l - m) carries the subtraction's u |l - m| as relative error.
    p = (L - lse[:, None]).exp()
    assert_within(dl, dl64, ((gamma(50 + 8) + U * (L - m[:, None]).abs()) * p + 2 * U) / 64, "dlogits")


def test_engine_op_wraps_any_engine_function():
    x, w, g = randn(8, 16), randn(16, 4), randn(8, 4)
    op = lambda a, b: scalify.unit.matmul(a, b, constrain="none")  # noqa: E731
    assert_equals_engine(through_torch(lambda a, b: SF.engine_op(op, a, b), [x, w], g), through_engine(op, [x, w], g))


def test_float64_inputs_stay_float64():
    x = randn(4, D).double().requires_grad_()
    y = SF.layer_norm(x)
    y.sum().backward()
    assert y.dtype == torch.float64 and x.grad.dtype == torch.float64
    ey = scalify.layer_norm(scalify.Tensor(x.detach().numpy()))
    np.testing.assert_array_equal(y.detach().numpy(), np.asarray(ey))


def test_no_grad_records_no_graph():
    x = randn(4, D).requires_grad_()
    with torch.no_grad():
        y = SF.gelu(x)
    assert not y.requires_grad and y.grad_fn is None


def test_a_second_backward_through_one_forward_is_refused():
    x = randn(4, D).requires_grad_()
    y = SF.gelu(x).sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="gelu: a backward already ran through this forward"):
        y.backward()


def test_bad_inputs_are_refused_by_name():
    x = randn(4, D)
    with pytest.raises(TypeError, match="inputs are float32 or float64, not torch.int64"):
        SF.gelu(torch.ones(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="runs on the CPU; got a tensor on meta"):
        SF.gelu(torch.empty(3, device="meta"))
    with pytest.raises(TypeError, match="needs torch.Tensor inputs, not ndarray"):
        SF.gelu(np.ones(3, np.float32))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="indices are an integer tensor, not torch.float32"):
        SF.embedding(torch.zeros(3), x)
    with pytest.raises(TypeError, match="indices are an integer torch.Tensor or NumPy array, not list"):
        SF.cross_entropy(x, [0, 1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="heads is an int, not float"):
        SF.causal_self_attention(randn(1, 4, 6), 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="causal_self_attention"):
        SF.causal_self_attention(randn(1, 4, 6), 4)
    with pytest.raises(ValueError, match="embedding"):
        SF.embedding(torch.tensor([0, 10]), x)
    with pytest.raises(TypeError, match="op must be callable"):
        SF.engine_op(3, x)  # type: ignore[arg-type]
