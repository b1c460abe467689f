"""scalify.torch.ScaledTensor: every aten op with a rule keeps the represented value (equal to the
same torch op on the unscaled values in float64, within the output storage's rounding and float32
accumulation) and keeps the data near unit scale for unit-scaled inputs, at scales 2^-60, 1 and
2^60, in float16 and float32 data; no op of the table reaches the unscaled fallback."""

import math

import pytest

import scalify  # before torch (scalify.torch warns otherwise)

torch = pytest.importorskip("torch")
F = torch.nn.functional

import scalify.torch as st  # noqa: E402

GEN = torch.Generator().manual_seed(3)
U = {torch.float16: 2.0**-11, torch.float32: 2.0**-24}  # unit roundoff of the data storage


def unit(*shape, positive=False):
    x = torch.randn(shape, generator=GEN, dtype=torch.float64)
    return x.abs() + 0.25 if positive else x


def value64(t):
    return t.data_tensor.double() * t.scale if isinstance(t, st.ScaledTensor) else t.double()


# name: (the op on tensors, input shapes, positive inputs, scale-equivariant: checked at 2^+-60,
# and optionally how many roundings into the storage it composes: addmm's product, then its sum)
CASES = {
    "add": (lambda a, b: a + b, [(4, 8), (4, 8)], False, True),
    "add broadcast": (lambda a, b: a + b, [(4, 8), (8,)], False, True),
    "add scalar": (lambda a: a + 3.0, [(4, 8)], False, False),
    "sub": (lambda a, b: a - b, [(4, 8), (4, 8)], False, True),
    "rsub scalar": (lambda a: 2.5 - a, [(4, 8)], False, False, 2),
    "mul": (lambda a, b: a * b, [(4, 8), (4, 8)], False, True),
    "mul scalar": (lambda a: a * 0.3, [(4, 8)], False, True),
    "div": (lambda a, b: a / b, [(4, 8), (4, 8)], True, True),
    "div scalar": (lambda a: a / 3.0, [(4, 8)], False, True),
    "neg": (lambda a: -a, [(4, 8)], False, True),
    "mm": (lambda a, b: a @ b, [(6, 16), (16, 5)], False, True),
    "bmm": (lambda a, b: torch.bmm(a, b), [(3, 6, 16), (3, 16, 5)], False, True),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b), [(5,), (6, 16), (16, 5)], False, True, 2),
    "relu": (F.relu, [(4, 8)], False, True),
    "gelu": (F.gelu, [(4, 8)], False, True),
    "gelu tanh": (lambda a: F.gelu(a, approximate="tanh"), [(4, 8)], False, True),
    "silu": (F.silu, [(4, 8)], False, True),
    "abs": (torch.abs, [(4, 8)], False, True),
    "sqrt": (torch.sqrt, [(4, 8)], True, True),
    "rsqrt": (torch.rsqrt, [(4, 8)], True, True),
    "square": (lambda a: a**2, [(4, 8)], False, True),
    "exp": (torch.exp, [(4, 8)], False, False),
    "log": (torch.log, [(4, 8)], True, False),
    "tanh": (torch.tanh, [(4, 8)], False, False),
    "sigmoid": (torch.sigmoid, [(4, 8)], False, False),
    "sum dim": (lambda a: a.sum(-1), [(4, 8)], False, True),
    "sum": (lambda a: a.sum(), [(4, 8)], False, True),
    "mean dims": (lambda a: a.mean((0, 2), keepdim=True), [(3, 4, 8)], False, True),
    "amax": (lambda a: a.amax(-1), [(4, 8)], False, True),
    "softmax": (lambda a: a.softmax(-1), [(4, 8)], False, False),
    "log_softmax": (lambda a: a.log_softmax(-1), [(4, 8)], False, False),
    "maximum": (torch.maximum, [(4, 8), (4, 8)], False, True),
    "where": (lambda a, b: torch.where(torch.arange(8) % 3 == 0, a, b), [(4, 8), (4, 8)], False, True),
    "masked_fill -inf": (lambda a: a.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf")), [(8, 8)], False, True),
    "cat": (lambda a, b: torch.cat([a, b], dim=1), [(4, 8), (4, 3)], False, True),
    "stack": (lambda a, b: torch.stack([a, b]), [(4, 8), (4, 8)], False, True),
    "views": (lambda a: a.view(2, 2, 8).transpose(0, 1).permute(2, 0, 1)[1:5, :, 0].unsqueeze(0).expand(3, 4, 2), [(4, 8)], False, True),
    "split": (lambda a: a.split(3, dim=1)[1], [(4, 8)], False, True),
}


def scaled_inputs(shapes, positive, scale, storage):
    out = []
    for shape in shapes:
        data = unit(*shape, positive=positive).to(storage)
        out.append(st.ScaledTensor(data, scale))
    return out


@pytest.mark.parametrize("storage", [torch.float16, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_keeps_the_value_and_the_data_near_unit_scale(case, storage):
    op, shapes, positive, equivariant, *roundings = CASES[case]
    for scale in ([2.0**-60, 1.0, 2.0**60] if equivariant else [1.0]):
        before = st.unhandled_ops()
        xs = scaled_inputs(shapes, positive, scale, storage)
        y = op(*xs)
        assert st.unhandled_ops() == before, f"{case}: fell back"
        assert isinstance(y, st.ScaledTensor), case
        assert y.data_tensor.dtype == storage, f"{case}: data stored as {y.data_tensor.dtype}"
        want = op(*[value64(x) for x in xs])
        got = value64(y)
        assert got.shape == want.shape
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)) and torch.equal(got[~finite], want[~finite]), case
        # Output rounding into the storage, and float32 arithmetic of up to 16 terms per output.
        bound = (roundings or [1])[0] * U[storage] * want[finite].abs() + 16 * 2.0**-24 * want[finite].abs().max()
        assert torch.all((got[finite] - want[finite]).abs() <= bound), f"{case} at scale {scale}"
        data = y.data_tensor.double()[finite]
        rms = data.square().mean().sqrt().item() if data.numel() else 1.0
        assert 2.0**-4 <= rms <= 2.0**4, f"{case} at scale {scale}: data rms {rms}"


def test_a_scaled_tensor_holds_data_and_a_power_of_two():
    t = st.ScaledTensor(torch.ones(2, 3, dtype=torch.float16), 2.0**-5)
    assert t.dtype == torch.float16 and t.shape == (2, 3) and t.scale == 2.0**-5
    assert torch.equal(t.unscaled(), torch.full((2, 3), 2.0**-5))
    assert "scale=0.03125" in repr(t)
    for bad in (3.0, -2.0, float("inf"), 2.0**128):
        with pytest.raises(ValueError, match="power of two"):
            st.ScaledTensor(torch.ones(2), bad)
    with pytest.raises(TypeError, match="float16, bfloat16, float32, float64, float8_e4m3fn or float8_e5m2"):
        st.ScaledTensor(torch.ones(2, dtype=torch.int64), 1.0)
    with pytest.raises(TypeError, match="plain torch.Tensor"):
        st.ScaledTensor(t, 1.0)


def test_as_scaled_picks_the_rms_power_of_two_and_is_differentiable():
    x = (torch.randn(64, 32, generator=GEN) * 1000).requires_grad_()
    s = st.as_scaled(x, torch.float16)
    rms = x.detach().square().mean().sqrt().item()
    assert s.scale == 2.0 ** math.floor(math.log2(rms)) and s.data_tensor.dtype == torch.float16
    s.unscaled().sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_an_op_without_a_rule_falls_back_once_with_a_warning():
    t = st.as_scaled(torch.randn(4, 4, generator=GEN))
    with pytest.warns(RuntimeWarning, match="no scale rule for aten.cumsum"):
        y = torch.cumsum(t, 0)
    before = st.unhandled_ops()["aten.cumsum.default"]
    torch.cumsum(t, 0)  # no second warning (pytest would fail on an unexpected one under -W error)
    assert st.unhandled_ops()["aten.cumsum.default"] == before + 1
    assert isinstance(y, st.ScaledTensor)
    torch.testing.assert_close(y.unscaled(), torch.cumsum(t.unscaled(), 0))


# Gradients: (the op, input shapes, positive inputs, checked at scales 2^+-20 too); the backward ops
# torch's autograd runs for each (mm with transposes, gelu_backward, _softmax_backward_data,
# embedding_dense_backward, ...) each with its rule, against float64 autograd on the values.
# Attention at scale 2^20 multiplies q k^T by 2^40: its saturated softmax amplifies any rounding.
GRADIENT_CASES = {
    "mul": (lambda a, b: a * b, [(4, 8), (4, 8)], False),
    "div": (lambda a, b: a / b, [(4, 8), (4, 8)], True),
    "mm": (lambda a, b: a @ b, [(6, 16), (16, 5)], False),
    "gelu tanh": (lambda a: F.gelu(a, approximate="tanh"), [(4, 8)], False),
    "gelu": (F.gelu, [(4, 8)], False),
    "silu": (F.silu, [(4, 8)], False),
    "relu": (F.relu, [(4, 8)], False),
    "tanh": (torch.tanh, [(4, 8)], False),
    "sigmoid": (torch.sigmoid, [(4, 8)], False),
    "sum": (lambda a: a.sum(-1), [(4, 8)], False),
    "mean": (lambda a: a.mean(-1), [(4, 8)], False),
    "softmax": (lambda a: a.softmax(-1), [(4, 8)], False),
    "log_softmax": (lambda a: a.log_softmax(-1), [(4, 8)], False),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (8,), w, b), [(4, 8), (8,), (8,)], False),
    "layer_norm without affine": (lambda x: F.layer_norm(x, (8,)), [(4, 8)], False),
    "rms_norm": (lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6), [(4, 8), (8,)], False),
    "embedding": (lambda w: F.embedding(torch.tensor([[1, 3, 3], [0, 5, 1]]), w), [(6, 8)], False),
    "cross_entropy": (lambda a: F.cross_entropy(a, torch.tensor([1, 0, 7, 3])), [(4, 8)], False),
    "causal attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(2, 2, 5, 4)] * 3, False, False),
    "views": (lambda a: a.view(2, 16).t()[3:9].reshape(-1), [(4, 8)], False),
}


@pytest.mark.parametrize("storage", [torch.float16, torch.float32])
@pytest.mark.parametrize("case", list(GRADIENT_CASES))
def test_gradients_through_scaled_tensors_equal_autograd_on_the_values(case, storage):
    op, shapes, positive, *at_scales = GRADIENT_CASES[case]
    for scale in ((2.0**-20, 1.0, 2.0**20) if not at_scales or at_scales[0] else (1.0,)):
        before = st.unhandled_ops()
        xs = [x.detach().requires_grad_() for x in scaled_inputs(shapes, positive, scale, storage)]
        y = op(*xs)
        g = unit(*y.shape)
        y.backward(st.ScaledTensor(g.to(storage), 1.0))
        assert st.unhandled_ops() == before, f"{case}: fell back"
        refs = [value64(x).detach().requires_grad_() for x in xs]
        op(*refs).backward(g.to(storage).double())
        for x, ref in zip(xs, refs):
            assert isinstance(x.grad, st.ScaledTensor) and x.grad.data_tensor.dtype == storage, case
            got, want = value64(x.grad), ref.grad
            # Up to four roundings into the storage per element (the gradient, and the steps before
            # it: softmax's probabilities, a norm's xhat), and cancellation in sums whose terms reach
            # the largest gradient: measured at most 4.9 U of it over 40 draws (attention), bound 8 U.
            bound = 4 * U[storage] * want.abs() + 8 * U[storage] * want.abs().max()
            assert torch.all((got - want).abs() <= bound), f"{case} at scale {scale}: {(got - want).abs().max()}"


def test_an_adamw_step_on_scaled_parameters_is_adamws_on_their_values():
    """torch.optim.AdamW (its for-loop, as on the CPU) over a ScaledTensor parameter with float16
    data and float32 state: every op it runs has its rule, the parameter keeps its scale (the
    engine's optimizer does), and the update equals AdamW's on the values to the data's rounding."""
    w = unit(32, 16) * 0.05
    plain = torch.nn.Parameter(w.to(torch.float16).to(torch.float32))
    scaled_param = torch.nn.Parameter(st.as_scaled(plain.detach(), torch.float16))
    scaled_param._state_storage = torch.float32
    scale = scaled_param.scale
    optimizers = [torch.optim.AdamW([p], lr=1e-2, weight_decay=0.1) for p in (plain, scaled_param)]
    before = st.unhandled_ops()
    for _ in range(3):
        g = unit(32, 16).float() * 1e-3
        g[0, 0] = 3e-6  # its square underflows float16: the second moment must hold it in float32
        plain.grad = g.to(torch.float16).to(torch.float32)
        scaled_param.grad = st.as_scaled(g, torch.float16)
        for o in optimizers:
            o.step()
        with torch.no_grad():
            plain.copy_(plain.to(torch.float16).to(torch.float32))  # the same float16 master weights
    assert st.unhandled_ops() == before
    assert scaled_param.scale == scale and scaled_param.data_tensor.dtype == torch.float16
    state = optimizers[1].state[scaled_param]
    assert state["exp_avg"].data_tensor.dtype == torch.float32 and value64(state["exp_avg_sq"])[0, 0] > 0
    # Per step: two roundings of the weight into float16 (the weight decay, then the update), and the
    # update (size lr) off by the gradients' float16 roundings at other scales (a few U relative).
    u, lr = U[torch.float16], 1e-2
    assert torch.all((value64(scaled_param) - plain.double()).abs() <= 3 * (2 * u * plain.double().abs() + 4 * u * lr))


@pytest.mark.parametrize("attention", [False, True])
def test_dropout_keeps_each_value_or_zeroes_it(attention):
    x = st.ScaledTensor(unit(64, 64).to(torch.float16), 2.0**-9).requires_grad_()
    before = st.unhandled_ops()
    if attention:  # SDPA's dropout on the probabilities (transformers' GPT-2 and BERT train with it)
        y = F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None], dropout_p=0.5)[0, 0]
        assert isinstance(y, st.ScaledTensor) and y.data_tensor.dtype == torch.float16
    else:
        y = F.dropout(x, 0.5)
        kept = value64(y) != 0
        assert 0.3 < kept.double().mean() < 0.7
        assert torch.equal(value64(y)[kept], 2 * value64(x).detach()[kept])
        y.backward(st.ScaledTensor(torch.ones(64, 64, dtype=torch.float16), 1.0))
        assert torch.equal(value64(x.grad), 2.0 * kept)
    assert st.unhandled_ops() == before


def test_the_dispatch_table_in_numerics_md_is_the_codes():
    import pathlib

    from scalify.torch._scaled_rules import rule_table

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "NUMERICS.md").read_text()
    begin, end = "<!-- dispatch table: begin -->\n", "<!-- dispatch table: end -->"
    assert doc[doc.index(begin) + len(begin):doc.index(end)] == rule_table()


def test_in_place_ops_reach_their_tensor_and_its_views():
    a = st.ScaledTensor(torch.tensor([2.0, -4.0, 6.0, 8.0], dtype=torch.float16), 2.0**-3)
    a[:2].mul_(10)  # a view: written in place, in the base's scale
    a[3:].zero_()
    torch.testing.assert_close(value64(a), torch.tensor([20.0, -40.0, 6.0, 0.0], dtype=torch.float64) / 8)
    with pytest.warns(RuntimeWarning, match="no scale rule for aten.clamp_"):
        a.clamp_(-1, 1)  # no rule: computed on the values, written back into a
    torch.testing.assert_close(value64(a), torch.tensor([1.0, -1.0, 0.75, 0.0], dtype=torch.float64))
    src = st.ScaledTensor(torch.ones(4, dtype=torch.float16), 1.0)
    a.copy_(src)
    a.mul_(3.0)
    assert torch.equal(value64(src), torch.ones(4, dtype=torch.float64))  # a's data is its own
    with pytest.raises(ValueError, match="does not fit"):
        a[:2].add_(1e6)  # a view cannot change the base's scale
    grad = st.ScaledTensor(torch.tensor([1.0], dtype=torch.float16), 2.0**-20)
    grad.add_(st.ScaledTensor(torch.tensor([1.0], dtype=torch.float16), 1.0))  # not a parameter: the add rule's scale
    torch.testing.assert_close(value64(grad), torch.tensor([1.0 + 2.0**-20], dtype=torch.float64), rtol=1e-3, atol=0)


def test_amsgrad_adamw_writes_its_maximum_into_its_state():
    # torch.maximum(..., out=max_exp_avg_sq): once a fallback that dropped its result (weights 5e6 off).
    w = unit(8, 4).float()
    plain, scaled_param = torch.nn.Parameter(w.clone()), torch.nn.Parameter(st.as_scaled(w.clone()))
    optimizers = [torch.optim.AdamW([p], lr=1e-2, amsgrad=True) for p in (plain, scaled_param)]
    before = st.unhandled_ops()
    for step in range(3):
        g = unit(8, 4).float() * 1e-3
        plain.grad, scaled_param.grad = g.clone(), st.as_scaled(g.clone())
        for o in optimizers:
            o.step()
    assert st.unhandled_ops() == before  # aten.maximum.out: the maximum rule into out
    torch.testing.assert_close(value64(scaled_param).float(), plain.detach(), rtol=1e-5, atol=1e-6)


def test_edges_behave_as_torch():
    inf = st.ScaledTensor(torch.tensor([float("-inf"), 0.0]), 0.0)  # ANY scale: the data is the value
    assert torch.equal(inf.unscaled(), torch.tensor([float("-inf"), 0.0]))
    x = st.ScaledTensor(torch.tensor([1.0, -1.0, 0.0]), 0.5)
    torch.testing.assert_close(value64(x / 0).float(), torch.tensor([1.0, -1.0, 0.0]) / 0, equal_nan=True)
    q = st.ScaledTensor(unit(1, 1, 3, 4).to(torch.float16), 1.0)
    mask = torch.tensor([[False] * 3, [True, False, False], [True, True, True]])  # row 0 sees nothing
    y = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert torch.equal(value64(y)[0, 0, 0], torch.zeros(4, dtype=torch.float64))  # SDPA's zeros, not NaN
    with pytest.raises(TypeError, match="CPU"):
        x.to("meta")
    half = st.ScaledTensor(torch.ones(4, dtype=torch.float16), 1.0)
    assert half.sum(dtype=torch.float32).data_tensor.dtype == torch.float32  # as torch's sum(dtype=)
    assert x.to(torch.float8_e4m3fn).data_tensor.dtype == torch.float8_e4m3fn and x.to(torch.float8_e4m3fn).scale == 0.5
    with pytest.raises(ValueError, match="power of two"):
        scalify._scalify.scaled.unary("neg", (torch.ones(2), 3.0))
    import io
    saved = io.BytesIO()
    torch.save({"w": x}, saved)
    saved.seek(0)
    assert torch.equal(value64(torch.load(saved)["w"]), value64(x))  # weights_only, torch's default


@pytest.mark.parametrize("storage", [torch.float16, torch.float32])
@pytest.mark.parametrize("case", ["relu", "gelu", "gelu tanh", "silu", "neg", "abs", "views", "sum dim", "mul scalar", "add"])
def test_rules_at_the_edge_of_float32_scales(case, storage):
    """Scales 2^-126 and 2^127, where data x scale leaves float32 (or its normal range): the
    value is kept (float64 reference), the data stays the storage's."""
    op, shapes, positive, _, *roundings = CASES[case]
    for scale in (2.0**-126, 2.0**127):
        xs = scaled_inputs(shapes, positive, scale, storage)
        y = op(*xs)
        want, got = op(*[value64(x) for x in xs]), value64(y)
        assert y.data_tensor.dtype == storage and torch.isfinite(got).all(), f"{case} at {scale}"
        bound = (roundings or [1])[0] * U[storage] * want.abs() + 16 * 2.0**-24 * want.abs().max()
        assert torch.all((got - want).abs() <= bound), f"{case} at scale {scale}"


def test_foreach_adamw_is_the_for_loops():
    """torch's foreach AdamW (aten._foreach_* over lists) runs each element through its rule: the
    same bits as the for-loop AdamW."""
    ws = [unit(8, 4).float(), unit(4).float()]
    runs = []
    for foreach in (False, True):
        params = [torch.nn.Parameter(st.as_scaled(w.clone(), torch.float16)) for w in ws]
        optimizer = torch.optim.AdamW(params, lr=1e-2, foreach=foreach)
        before = st.unhandled_ops()
        for step in range(3):
            for p, w in zip(params, ws):
                p.grad = st.as_scaled(torch.full_like(w, 1e-3) * (step + 1), torch.float16)
            optimizer.step()
        assert st.unhandled_ops() == before
        runs.append([(p.data_tensor.clone(), p.scale) for p in params])
    for (a, sa), (b, sb) in zip(*runs):
        assert sa == sb and torch.equal(a, b)


def test_amsgrad_foreach_is_the_for_loop():
    # aten._foreach_maximum_ has no single-tensor method (torch.Tensor.maximum_): it raised; the
    # for-loop's torch.maximum(..., out=) reached the fallback.
    w = unit(8, 4).float()
    runs = []
    for foreach in (False, True):
        p = torch.nn.Parameter(st.as_scaled(w.clone(), torch.float16))
        optimizer = torch.optim.AdamW([p], lr=1e-2, amsgrad=True, foreach=foreach)
        before = st.unhandled_ops()
        for step in range(3):
            p.grad = st.as_scaled(torch.full_like(w, 1e-3) * (3 - step), torch.float16)
            optimizer.step()
        assert st.unhandled_ops() == before
        runs.append((p.data_tensor.clone(), p.scale, value64(optimizer.state[p]["max_exp_avg_sq"])))
    (a, sa, ma), (b, sb, mb) = runs
    assert sa == sb and torch.equal(a, b) and torch.equal(ma, mb) and bool((ma > 0).all())


def test_views_share_their_base_scale_and_data():
    a = st.as_scaled(torch.ones(4) * 3, torch.float16)
    v = a[:2]
    a.mul_(1000.0)  # the base takes a new scale: the view sees data and scale
    assert torch.equal(v.unscaled(), torch.full((2,), 3000.0))
    b = st.as_scaled(torch.full((4,), 8.0), torch.float16)
    b[:2].bernoulli_(1.0)  # a mask written into a view, at the base's scale
    assert torch.equal(b.unscaled(), torch.tensor([1.0, 1.0, 8.0, 8.0]))
    z = torch.zeros_like(b)  # ANY scale: the first write through a view gives the base its scale
    z[2:] = b[2:]
    assert torch.equal(z.unscaled(), torch.tensor([0.0, 0.0, 8.0, 8.0]))
