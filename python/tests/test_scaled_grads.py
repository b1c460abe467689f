"""The engine's backward rules and fused ops on (data, scale) pairs of torch tensors
(scalify._scalify.scaled, python/src/scaled_grad_bindings.cpp), what scalify.torch's dispatch calls
for aten's backward ops.

Each gradient is checked twice: bit for bit (data, storage dtype and scale) against the engine's own
autograd through scalify.Tensor where the Python API reaches the op, and against torch's autograd
on the represented values in float64 within a bound derived from the roundings the engine makes
(each stated where it is computed). Data f32 and f16, scales 2^-20, 1 and 2^20.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import scalify

pytest.importorskip("torch")
import torch  # noqa: E402  (after the skip: torch is optional)

F = torch.nn.functional
scaled = scalify._scalify.scaled

SCALES = [2.0**-20, 1.0, 2.0**20]
DTYPES = ["f32", "f16"]
TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16}
NP_DTYPE = {"f32": np.float32, "f16": np.float16}
U = {"f32": 2.0**-24, "f16": 2.0**-11}  # unit roundoff of the storage
U32 = 2.0**-24  # the kernels compute in f32
# Half the spacing of the storage's subnormals: the absolute error of rounding a tiny value into it.
SUB = {"f32": 2.0**-150, "f16": 2.0**-25}
Pair = tuple[Any, "float | None"]
CASES = [(s, d) for d in DTYPES for s in SCALES]


def unit_data(shape: tuple[int, ...], dtype: str, seed: int, positive: bool = False) -> np.ndarray:
    """Data of RMS 1.5 (so as_scaled picks exactly the scale asked for), representable in dtype, as f32."""
    z = np.random.default_rng(seed).standard_normal(shape)
    if positive:
        z = np.abs(z) + 0.25
    z = z / np.sqrt(np.mean(z * z)) * 1.5
    out: np.ndarray = z.astype(NP_DTYPE[dtype]).astype(np.float32)
    return out


def engine_leaf(data: np.ndarray, scale: float, dtype: str) -> scalify.Tensor:
    """A leaf of the engine with exactly this data (stored in dtype) and scale."""
    if dtype == "f32":
        t = scalify.Tensor(data, requires_grad=True, scale=scale)
    else:
        t = scalify.as_scaled(data.astype(np.float64) * scale, dtype=dtype)
    assert t.dtype == dtype and t.scale == scale and np.array_equal(t.data, data)
    return t


def pair(data: np.ndarray, scale: float | None, dtype: str) -> Pair:
    return (torch.from_numpy(np.ascontiguousarray(data)).to(TORCH_DTYPE[dtype]), scale)


def value(p: Pair) -> torch.Tensor:
    """The represented value of a pair, in f64."""
    return p[0].double() * (1.0 if p[1] is None else p[1])


def engine_grad(t: scalify.Tensor) -> tuple[np.ndarray, float]:
    """The engine's gradient of a leaf as (data, scale): its value divided by its power-of-two scale (exact)."""
    s = t.grad_scale
    assert s is not None
    return np.asarray(t.grad, dtype=np.float64) / s, s


def assert_same_as_engine(p: Pair, t: scalify.Tensor, dtype: str) -> None:
    data, s = engine_grad(t)
    assert p[1] == s
    assert p[0].dtype == TORCH_DTYPE[dtype]
    np.testing.assert_array_equal(p[0].double().numpy(), data)


def floor(p: Pair) -> float:
    """The absolute error of rounding into the pair's storage near zero, in represented units."""
    return (SUB["f16"] if p[0].dtype == torch.float16 else SUB["f32"]) * (1.0 if p[1] is None else p[1])


def assert_within(got: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor) -> None:
    err = (got - ref).abs()
    worst = int(torch.argmax(err - tol))
    assert bool((err <= tol).all()), f"error {float(err.flatten()[worst])} over the bound {float(tol.flatten()[worst])}"


def upstream(shape: tuple[int, ...], dtype: str, seed: int, scale: float) -> tuple[scalify.Tensor, Pair]:
    """A scaled gradient for an op's output: the engine receives it as (y * c).sum()'s, which is c."""
    gd = unit_data(shape, dtype, seed)
    return scalify.Tensor(gd, scale=scale), pair(gd, scale, dtype)


def backprop(y: scalify.Tensor, c: scalify.Tensor) -> None:
    (y * c).sum().backward()


# --- elementwise maps -------------------------------------------------------------------------

UNARY: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any], bool]] = [
    ("gelu_tanh", scalify.gelu, lambda t: F.gelu(t, approximate="tanh"), False),
    ("gelu_erf", scalify.gelu_erf, F.gelu, False),
    ("silu", scalify.silu, F.silu, False),
    ("relu", scalify.relu, F.relu, False),
    ("tanh", scalify.tanh, torch.tanh, False),
    ("sigmoid", scalify.sigmoid, torch.sigmoid, False),
    ("exp", scalify.exp, torch.exp, False),
    ("log", scalify.log, torch.log, True),
    ("sqrt", lambda x: x.sqrt(), torch.sqrt, True),
]


@pytest.mark.parametrize("scale,dtype", CASES)
@pytest.mark.parametrize("op,engine_op,torch_op,positive", UNARY, ids=[u[0] for u in UNARY])
def test_unary_backward(op: str, engine_op: Any, torch_op: Any, positive: bool, scale: float, dtype: str) -> None:
    if op == "exp" and scale > 1:
        pytest.skip("exp of values near 2^20 is inf in every precision")
    data = unit_data((6, 40), dtype, 1, positive)
    x = engine_leaf(data, scale, dtype)
    y = engine_op(x)
    c, g = upstream((6, 40), dtype, 2, 2.0**-3 * scale)
    backprop(y, c)
    xp = pair(data, scale, dtype)
    yp = scaled.unary(op, xp)
    assert yp[1] == y.scale and np.array_equal(yp[0].float().numpy(), y.data)  # the forward is the engine's too
    dx = scaled.unary_backward(op, xp, yp, g)
    assert_same_as_engine(dx, x, dtype)
    if op in ("exp", "sqrt", "sigmoid", "tanh"):  # aten's *_backward(grad, output): from y alone
        dy_only = scaled.unary_backward(op, None, yp, g)
        assert dy_only[1] == dx[1] and torch.equal(dy_only[0], dx[0])
    if op == "relu":  # threshold_backward(grad, result, 0): y in x's place
        from_y = scaled.unary_backward(op, yp, None, g)
        assert from_y[1] == dx[1] and torch.equal(from_y[0], dx[0])
    if op == "log" and dtype == "f16" and scale < 1:
        # log's gradient keeps g's scale while 1 / x grows as 1 / X_s: at X_s = 2^-20 its f16 data
        # (2^20 g_d / x_d) saturates, in the engine as here (a limit of the rule, reported).
        assert float(dx[0].abs().max()) == 65504.0
        return
    xr = value(xp).requires_grad_()
    yr = torch_op(xr)
    yr.backward(value(g))
    assert xr.grad is not None
    # f' is evaluated in f32 on the exact x (a few ulps of terms <= ~1.2 |g|), or from y rounded
    # into storage (exp: y; sigmoid: y (1 - y); tanh: 1 - y^2; sqrt: 1 / y: at most 2 u |y| + 2 u y^2
    # relative to |g| terms); then one rounding into storage.
    ref, gv, yv, xv = xr.grad, value(g).abs(), yr.detach().abs(), xr.detach().abs()
    tol = 2 * U[dtype] * ref.abs() + 4 * U[dtype] * gv * (yv + yv * yv) + 16 * U32 * gv * (1 + xv.clamp_max(8)) + floor(dx)
    assert_within(value(dx), ref, tol)


@pytest.mark.parametrize("scale,dtype", CASES)
@pytest.mark.parametrize("p", [2.0, 3.0, 0.5, -1.0])
def test_pow_backward(p: float, scale: float, dtype: str) -> None:
    data = unit_data((5, 16), dtype, 3, positive=True)
    x = engine_leaf(data, scale, dtype)
    c, g = upstream((5, 16), dtype, 4, scale)
    backprop(x**p, c)
    dx = scaled.pow_backward(pair(data, scale, dtype), p, g)
    assert_same_as_engine(dx, x, dtype)
    xr = value(pair(data, scale, dtype)).requires_grad_()
    (xr**p).backward(value(g))
    assert xr.grad is not None
    # p x^(p-1) in f32 from exact x (pow a few ulps), times p and g, one rounding into storage.
    assert_within(value(dx), xr.grad, (2 * U[dtype] + 8 * U32) * xr.grad.abs() + floor(dx))


# --- softmax and log_softmax from their outputs -----------------------------------------------


@pytest.mark.parametrize("scale,dtype", CASES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward(log: bool, scale: float, dtype: str) -> None:
    D = 24
    data = unit_data((5, D), dtype, 5)
    x = engine_leaf(data, scale, dtype)
    xp = pair(data, scale, dtype)
    yp = scaled.softmax(xp, -1, log)
    c, g = upstream((5, D), dtype, 6, 2.0**20 * scale)
    dx = scaled.softmax_backward(yp, g, -1, log)
    y = scalify.log_softmax(x) if log else scalify.softmax(x)
    assert yp[1] == y.scale and np.array_equal(yp[0].float().numpy(), y.data)
    backprop(y, c)
    assert_same_as_engine(dx, x, dtype)
    xr = value(xp).requires_grad_()
    yr = torch.log_softmax(xr, -1) if log else torch.softmax(xr, -1)
    yr.backward(value(g))
    assert xr.grad is not None
    p, gv = torch.softmax(xr.detach(), -1), value(g).abs()
    # From y rounded into storage (relative u, log-probabilities absolute u |y|) and f32 sums over D:
    # softmax: y_i (g_i - sum y g); log_softmax: g_i - e^(y_i) sum g. Then one rounding into storage.
    k = 4 * U[dtype] + D * U32
    if log:
        terms = gv + p * (1 + yr.detach().abs()) * gv.sum(-1, keepdim=True)
    else:
        terms = p * (gv + (p * gv).sum(-1, keepdim=True))
    assert_within(value(dx), xr.grad, U[dtype] * xr.grad.abs() + k * terms + floor(dx))


# --- the fused normalisation and its affine ---------------------------------------------------


def norm_reference(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None, eps: float, center: bool) -> torch.Tensor:
    if center:
        return F.layer_norm(x, x.shape[-1:], w, b, eps)
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    y = y * w if w is not None else y
    return y + b if b is not None else y


@pytest.mark.parametrize("scale,dtype", CASES)
@pytest.mark.parametrize("affine", ["weight_bias", "weight", "none"])
@pytest.mark.parametrize("center", [True, False])
def test_fused_norm(center: bool, affine: str, scale: float, dtype: str) -> None:
    D, eps = 32, 1e-5
    data = unit_data((7, D), dtype, 7)
    wd = unit_data((D,), dtype, 8) if affine != "none" else None
    bd = unit_data((D,), dtype, 9) if affine == "weight_bias" else None
    ws, bs = 2.0, 0.25
    x = engine_leaf(data, scale, dtype)
    w = engine_leaf(wd, ws, dtype) if wd is not None else None
    b = engine_leaf(bd, bs, dtype) if bd is not None else None
    xp = pair(data, scale, dtype)
    wp = pair(wd, ws, dtype) if wd is not None else None
    bp = pair(bd, bs, dtype) if bd is not None else None
    yp, mean, rstd = scaled.fused_norm(xp, wp, bp, eps, center)
    c, g = upstream((7, D), dtype, 10, 2.0**-7)
    dx, dw, db = scaled.fused_norm_backward(g, xp, wp, bp, eps, center)
    assert (dw is None) == (w is None) and (db is None) == (b is None)
    if center:  # scalify.layer_norm reaches the engine's fused (and unfused) norm; rms_norm has no Python op
        y = scalify.layer_norm(x, w, b, eps=eps)
        assert yp[1] == y.scale and np.array_equal(yp[0].double().numpy(), y.data)
        backprop(y, c)
        assert_same_as_engine(dx, x, dtype)
        if dw is not None and w is not None:
            assert_same_as_engine(dw, w, dtype)
        if db is not None and b is not None:
            assert_same_as_engine(db, b, dtype)
    # torch in f64 on the represented values
    xr = value(xp).requires_grad_()
    wr = value(wp).requires_grad_() if wp is not None else None
    br = value(bp).requires_grad_() if bp is not None else None
    yr = norm_reference(xr, wr, br, eps, center)
    yr.backward(value(g))
    assert xr.grad is not None
    # The statistics aten returns, of the represented x: rstd is the kernel's f32 (one rounding), the mean an f32 mean over D.
    var = (xr.detach() - (xr.detach().mean(-1, keepdim=True) if center else 0)).pow(2).mean(-1, keepdim=True)
    rstd_ref = torch.rsqrt(var + eps)
    assert rstd.shape == (7, 1) and (mean is None) == (not center)
    assert_within(rstd.double(), rstd_ref, 2 * U32 * rstd_ref)
    if mean is not None:
        assert_within(mean.double(), xr.detach().mean(-1, keepdim=True), D * U32 * xr.detach().abs().mean(-1, keepdim=True))
    # Forward: xhat in f32 from exact x (a few ulps), times w plus b, one rounding into the output's storage.
    out_u = U["f16"] if yp[0].dtype == torch.float16 else U32
    wv = wr.detach().abs() if wr is not None else 1.0
    bv = br.detach().abs() if br is not None else 0.0
    xhat_abs = ((xr.detach() - (xr.detach().mean(-1, keepdim=True) if center else 0)) * rstd_ref).abs()
    assert_within(value(yp), yr.detach(), out_u * yr.detach().abs() + 8 * U32 * (xhat_abs * wv + bv) + floor(yp))
    # dx = rstd (g w - mean(g w) - xhat mean(g w xhat)) / (1 for unscaled): terms in f32, sums in
    # double; one rounding into x's storage.
    gw = value(g).abs() * (wv if isinstance(wv, torch.Tensor) else 1.0)
    terms = rstd_ref * (gw + gw.mean(-1, keepdim=True) + xhat_abs * (gw * xhat_abs).mean(-1, keepdim=True))
    assert_within(value(dx), xr.grad, U[dtype] * xr.grad.abs() + 16 * U32 * terms + floor(dx))
    # dw = sum over rows of g xhat, db = sum of g: f32 sums over 7 rows, rounded into their storage.
    if dw is not None and wr is not None:
        assert wr.grad is not None
        assert_within(value(dw), wr.grad, U[dtype] * wr.grad.abs() + 16 * U32 * (value(g).abs() * xhat_abs).sum(0) + floor(dw))
    if db is not None and br is not None:
        assert br.grad is not None
        assert_within(value(db), br.grad, U[dtype] * br.grad.abs() + 16 * U32 * value(g).abs().sum(0) + floor(db))


def test_fused_norm_refuses_what_the_engine_does_not_fuse() -> None:
    x = (torch.ones(2, 4), 2.0)
    w = (torch.ones(4), None)  # a scaled x with an unscaled weight: the engine composes the ops
    with pytest.raises(ValueError, match="all unscaled or all with one normal scale"):
        scaled.fused_norm(x, w, None, 1e-5)
    with pytest.raises(ValueError, match="bias without a weight"):
        scaled.fused_norm(x, None, (torch.ones(4), 1.0), 1e-5)
    with pytest.raises(ValueError, match="differ in shape"):
        scaled.fused_norm_backward((torch.ones(2, 3), 1.0), x, (torch.ones(4), 1.0), None, 1e-5)
    with pytest.raises(TypeError, match="pair"):
        scaled.fused_norm(torch.ones(2, 4), None, None, 1e-5)  # type: ignore[arg-type]


# --- embedding, cross-entropy, attention ------------------------------------------------------


@pytest.mark.parametrize("scale,dtype", CASES)
def test_embedding_backward(scale: float, dtype: str) -> None:
    V, D = 11, 8
    ids = torch.tensor([[1, 3, 3, 0], [10, 3, 1, 1]], dtype=torch.int64)
    gd = unit_data((2, 4, D), dtype, 11)
    g = pair(gd, scale, dtype)
    dw = scaled.embedding_backward(g, ids, V, dtype=dtype)
    assert dw[1] == scale and dw[0].dtype == TORCH_DTYPE[dtype] and dw[0].shape == (V, D)
    wr = torch.zeros(V, D, dtype=torch.float64, requires_grad=True)
    F.embedding(ids, wr).backward(value(g))
    assert wr.grad is not None
    # Rows scatter-added in f32 (at most 4 terms), rounded into the weight's storage.
    counts = torch.zeros(V, 1, dtype=torch.float64).index_add_(0, ids.flatten(), torch.ones(8, 1, dtype=torch.float64))
    assert_within(value(dw), wr.grad, U[dtype] * wr.grad.abs() + 4 * U32 * counts * value(g).abs().max() + floor(dw))
    with pytest.raises(ValueError, match="does not match ids"):
        scaled.embedding_backward((torch.ones(3, D), 1.0), ids, V)
    with pytest.raises(TypeError, match="int64"):
        scaled.embedding_backward(g, ids.float(), V)


@pytest.mark.parametrize("scale,dtype", CASES)
def test_cross_entropy_backward(scale: float, dtype: str) -> None:
    N, C = 6, 10
    data = unit_data((N, C), dtype, 12)
    targets = np.array([0, 9, 3, 3, 5, 1], dtype=np.int64)
    lp = pair(data, scale, dtype)
    # The engine's: a scaled loss seeds the gradient (1, scale 1).
    x = engine_leaf(data, scale, dtype)
    scalify.cross_entropy(x, targets).backward()
    one = scaled.cross_entropy_backward(lp, torch.from_numpy(targets), (torch.ones(()), 1.0))
    data_e, s_e = engine_grad(x)
    assert one[1] == s_e and one[0].dtype == torch.float32  # kept as computed, as the engine keeps it
    np.testing.assert_array_equal(one[0].double().numpy(), data_e)
    for g in [(torch.tensor(1.5), 2.0**-20), (torch.tensor(-0.75), 2.0**20)]:
        dx = scaled.cross_entropy_backward(lp, torch.from_numpy(targets), g)
        xr = value(lp).requires_grad_()
        F.cross_entropy(xr, torch.from_numpy(targets)).backward(value(g))
        assert xr.grad is not None
        # softmax in f32 from exact logits (a few ulps of p), minus the one-hot, times c / pow2(c).
        p = torch.softmax(xr.detach(), -1)
        c = abs(float(value(g))) / N
        assert_within(value(dx), xr.grad, 8 * U32 * c * (p + 1))


def attention_reference(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    B, T, D3 = qkv.shape
    D = D3 // 3
    q, k, v = (t.reshape(B, T, heads, D // heads).transpose(1, 2) for t in qkv.split(D, -1))
    s = q @ k.transpose(-1, -2) / (D // heads) ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, D)


@pytest.mark.parametrize("scale,dtype", CASES)
def test_causal_attention(scale: float, dtype: str) -> None:
    B, T, D, H = 2, 5, 8, 2
    data = unit_data((B, T, 3 * D), dtype, 13)  # scores s^2 q_d k_d: uniform rows at 2^-20, one-hot at 2^20
    qkv = pair(data, scale, dtype)
    yp, probs = scaled.causal_attention(qkv, H)
    assert yp[1] == scale and yp[0].dtype == TORCH_DTYPE[dtype] and probs.shape == (B, H, T, T)
    gd = unit_data((B, T, D), dtype, 14)
    g = pair(gd, 2.0**-5, dtype)
    dq = scaled.causal_attention_backward(qkv, probs, g, H)
    assert dq[0].dtype == TORCH_DTYPE[dtype]
    assert dq[1] == (2.0**-5 * scale if scale != 1.0 else 2.0**-5)  # rules::attention_grad: g_s s
    if dtype == "f16" and scale < 1:
        # rules::attention_grad puts dv's data 1 / s from unit (|log2 s| binades): at s = 2^-20 that
        # is beyond f16's 2^16, and dv saturates, in the engine as here (a limit of the rule, reported).
        assert float(dq[0][..., 2 * D :].abs().max()) == 65504.0
        return
    xr = value(qkv).requires_grad_()
    yr = attention_reference(xr, H)
    yr.backward(value(g))
    assert xr.grad is not None
    # Bounds from the same graph on absolute values (every product and sum a few f32 ulps, the
    # softmax's exp of O(1) scores), plus one rounding into storage.
    a = xr.detach().abs()
    p = torch.softmax(attention_reference_scores(xr.detach(), H), -1)
    y_abs = heads_merge(p @ heads_split(a[..., 2 * D :], H))
    assert_within(value(yp), yr.detach(), U[dtype] * yr.detach().abs() + 64 * U32 * y_abs + floor(yp))
    gh, vh, qh, kh = heads_split(value(g).abs(), H), heads_split(a[..., 2 * D :], H), heads_split(a[..., :D], H), heads_split(a[..., D : 2 * D], H)
    dp = gh @ vh.transpose(-1, -2)
    ds = p * (dp + (p * dp).sum(-1, keepdim=True)) / (D // H) ** 0.5
    bound = torch.cat([heads_merge(ds @ kh), heads_merge(ds.transpose(-1, -2) @ qh), heads_merge(p.transpose(-1, -2) @ gh)], -1)
    assert_within(value(dq), xr.grad, U[dtype] * xr.grad.abs() + 64 * U32 * bound + floor(dq))
    with pytest.raises(ValueError, match="do not match"):
        scaled.causal_attention_backward(qkv, probs[:, :1], g, H)
    with pytest.raises(ValueError, match="divisible by heads"):
        scaled.causal_attention((torch.ones(1, 2, 9), 1.0), 2)


def heads_split(t: torch.Tensor, heads: int) -> torch.Tensor:
    B, T, D = t.shape
    return t.reshape(B, T, heads, D // heads).transpose(1, 2)


def heads_merge(t: torch.Tensor) -> torch.Tensor:
    B, H, T, hd = t.shape
    return t.transpose(1, 2).reshape(B, T, H * hd)


def attention_reference_scores(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    D = qkv.shape[-1] // 3
    q, k = heads_split(qkv[..., :D], heads), heads_split(qkv[..., D : 2 * D], heads)
    T = qkv.shape[1]
    s = q @ k.transpose(-1, -2) / (D // heads) ** 0.5
    return s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))


def test_unary_backward_names_what_is_wrong() -> None:
    x = (torch.ones(3), 1.0)
    with pytest.raises(ValueError, match="unknown op 'cosh'"):
        scaled.unary_backward("cosh", x, None, x)
    with pytest.raises(ValueError, match="tanh needs its output"):
        scaled.unary_backward("tanh", x, None, x)
    with pytest.raises(ValueError, match="gelu_tanh needs its input"):
        scaled.unary_backward("gelu_tanh", None, x, x)
    with pytest.raises(ValueError, match="one shape"):
        scaled.unary_backward("relu", x, None, (torch.ones(4), 1.0))


# --- matmul, where, slice, max ----------------------------------------------------------------


@pytest.mark.parametrize("scale,dtype", CASES)
@pytest.mark.parametrize("x_shape,w_shape", [((3, 4, 16), (16, 8)), ((4, 16), (16, 8)), ((2, 4, 16), (2, 16, 8))])
def test_matmul_backward(x_shape: tuple[int, ...], w_shape: tuple[int, ...], scale: float, dtype: str) -> None:
    xd, wd = unit_data(x_shape, dtype, 15), unit_data(w_shape, dtype, 16)
    x, w = engine_leaf(xd, scale, dtype), engine_leaf(wd, 0.5, dtype)
    y = scalify.matmul(x, w)
    c, g = upstream(tuple(y.shape), dtype, 17, 2.0**-9)
    backprop(y, c)
    xp, wp = pair(xd, scale, dtype), pair(wd, 0.5, dtype)
    dx, dw = scaled.matmul_backward(xp, wp, g)
    assert_same_as_engine(dx, x, dtype)
    assert_same_as_engine(dw, w, dtype)
    xr, wr = value(xp).requires_grad_(), value(wp).requires_grad_()
    (xr @ wr).backward(value(g))
    assert xr.grad is not None and wr.grad is not None
    # f32 dot products (a few ulps of the sums of absolute products), one rounding into storage.
    gv = value(g).abs()
    dx_terms = gv @ wr.detach().abs().transpose(-1, -2)
    dw_terms = (xr.detach().abs().transpose(-1, -2) @ gv).reshape(-1, *w_shape).sum(0) if len(w_shape) == 2 else None
    assert_within(value(dx), xr.grad, U[dtype] * xr.grad.abs() + 64 * U32 * dx_terms + floor(dx))
    if dw_terms is None:
        dw_terms = xr.detach().abs().transpose(-1, -2) @ gv
    assert_within(value(dw), wr.grad, U[dtype] * wr.grad.abs() + 64 * U32 * dw_terms + floor(dw))


@pytest.mark.parametrize("scale,dtype", CASES)
def test_slice_backward(scale: float, dtype: str) -> None:
    data = unit_data((3, 6), dtype, 18)
    x = engine_leaf(data, scale, dtype)
    c, g = upstream((3, 2), dtype, 19, 2.0 * scale)
    backprop(x[:, 1:3], c)
    dx = scaled.slice_backward(g, [3, 6], 1, 1, 3, dtype=dtype)
    assert_same_as_engine(dx, x, dtype)
    xr = value(pair(data, scale, dtype)).requires_grad_()
    xr[:, 1:3].backward(value(g))
    assert xr.grad is not None
    assert torch.equal(value(dx), xr.grad)  # a copy: exact
    with pytest.raises(ValueError, match="slice's shape"):
        scaled.slice_backward(g, [3, 6], 1, 1, 4)
    with pytest.raises(IndexError):
        scaled.slice_backward(g, [3, 6], 2, 1, 3)


@pytest.mark.parametrize("scale,dtype", CASES)
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_backward(keepdim: bool, scale: float, dtype: str) -> None:
    xp = pair(unit_data((4, 5, 3), dtype, 20), scale, dtype)
    _, index = torch.max(xp[0], 1, keepdim=keepdim)
    g = pair(unit_data((4, 1, 3) if keepdim else (4, 3), dtype, 21), scale * 4, dtype)
    dx = scaled.max_backward(g, [4, 5, 3], 1, index, dtype=dtype)
    assert dx[1] == scale * 4 and dx[0].dtype == TORCH_DTYPE[dtype]
    xr = value(xp).requires_grad_()
    torch.max(xr, 1, keepdim=keepdim)[0].backward(value(g))
    assert xr.grad is not None
    assert torch.equal(value(dx), xr.grad)  # g moved to the maxima: exact


@pytest.mark.parametrize("scale,dtype", CASES)
def test_where_backward(scale: float, dtype: str) -> None:
    cond = torch.from_numpy(np.random.default_rng(22).random((4, 6)) < 0.5)
    g = pair(unit_data((4, 6), dtype, 23), scale, dtype)
    dx, dy = scaled.where_backward(cond, g, [4, 6], [6], y_dtype="f32")
    # The zeros take any scale: g's is kept; y's sums 4 rows (the sum rule: times pow2(sqrt 4)).
    assert dx[1] == scale and dy[1] == scale * 2
    assert dx[0].dtype == TORCH_DTYPE[dtype] and dy[0].dtype == torch.float32
    xr = torch.zeros(4, 6, dtype=torch.float64, requires_grad=True)
    yr = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    torch.where(cond, xr, yr).backward(value(g))
    assert xr.grad is not None and yr.grad is not None
    assert torch.equal(value(dx), xr.grad)
    # y's gradient sums 4 rows: the sum rule's f32 sum, one rounding.
    assert_within(value(dy), yr.grad, 4 * U32 * value(g).abs().sum(0))
