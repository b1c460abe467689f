"""scalify.torch: any torch model's linear layers under any Scalify recipe. The layer must pass
torch's layouts, dtypes and autograd through to the engine's quantised linear layer unchanged
(checked against the engine's layer driven directly, bit for bit, for every quantised preset),
compute what the recipe defines (checked against a NumPy reference built from scalify.quantize),
keep its quantisers' state in state_dict(), and behave like an nn.Module."""

import copy
import io

import numpy as np
import pytest

import scalify  # before torch (scalify.torch warns otherwise)

torch = pytest.importorskip("torch")

import scalify.torch as st  # noqa: E402
from scalify import _scalify  # noqa: E402

QUANTIZED_PRESETS = [n for n in scalify.preset_names() if scalify.preset(n).linear.quantized]
GEN = torch.Generator().manual_seed(5)


def randn(*shape, scale=1.0):
    return torch.randn(*shape, generator=GEN) * scale


def engine_linear(recipe, name, x2d, weight_in_out, grad_output):
    """The engine's quantised linear layer on its own layouts (x [rows, in], w [in, out])."""
    layer = _scalify.QuantizedLinear(recipe, name)
    y, call = layer.forward(x2d.numpy(), weight_in_out.numpy(), True)
    dx, dw = call.backward(grad_output.numpy())
    return y, dx, dw


@pytest.mark.parametrize("preset", QUANTIZED_PRESETS)
def test_layer_equals_the_engines_linear_bit_for_bit(preset):
    layer = st.Linear(48, 40, recipe=preset, name="blocks.0.fc")
    with torch.no_grad():
        layer.weight.copy_(randn(40, 48, scale=0.2))
        layer.bias.copy_(randn(40))
    x = randn(2, 16, 48).requires_grad_()  # 3-D: the layer flattens the leading dimensions
    g = randn(2, 16, 40, scale=1e-3)
    y = layer(x)
    y.backward(g)
    want_y, want_dx, want_dw = engine_linear(scalify.preset(preset).linear, "blocks.0.fc", x.detach().reshape(32, 48),
                                             layer.weight.detach().t().contiguous(), g.reshape(32, 40))
    np.testing.assert_array_equal(y.detach().reshape(32, 40).numpy(), want_y + layer.bias.detach().numpy())
    np.testing.assert_array_equal(x.grad.reshape(32, 48).numpy(), want_dx)
    np.testing.assert_array_equal(layer.weight.grad.numpy(), want_dw.T)
    # The engine's bias gradient: the rows summed in f64, rounded once (torch's float32 sum differs).
    np.testing.assert_array_equal(layer.bias.grad.numpy(), g.double().sum(dim=(0, 1)).float().numpy())


def test_the_name_sets_the_stochastic_rounding_stream():
    x, w, g = randn(32, 64), randn(64, 64, scale=0.1), randn(32, 64, scale=1e-3)
    grads = []
    for name in ("a", "a", "b"):
        layer = st.Linear(64, 64, bias=False, recipe="nvfp4_no_hadamard", name=name)
        with torch.no_grad():
            layer.weight.copy_(w)
        layer(x).backward(g)
        grads.append(layer.weight.grad.clone())
    assert torch.equal(grads[0], grads[1]) and not torch.equal(grads[0], grads[2])


def test_current_scaling_computes_the_quantised_product():
    """y = decode(q(x)) decode(q(w))^T with each operand's scale from its amax: the reference
    quantises with scalify.quantize at the scales the layer reports and multiplies in f64; the
    layer's GEMM adds exact products in f32, so it may differ by K * 2^-24 * sum |products|."""
    layer = st.Linear(96, 32, bias=False, recipe="current", name="l")
    with torch.no_grad():
        layer.weight.copy_(randn(32, 96, scale=0.05))
    x = randn(24, 96)
    x[3, 7] = 40.0  # an outlier sets the activation's scale
    y = layer(x.requires_grad_()).detach().numpy().astype(np.float64)
    stats = {s["operand"]: s for s in layer.statistics()}
    assert stats["activation"]["amax"] == 40.0
    assert stats["weight"]["amax"] == layer.weight.detach().abs().max().item()

    def decoded(t, operand):
        scale = stats[operand]["scale"]  # the decode factor: value = code * scale
        codes = scalify.quantize(np.ascontiguousarray(t, dtype=np.float32), "e4m3", scale=1.0 / scale)
        return scalify.dequantize(codes, "e4m3").astype(np.float64) * scale

    qx, qw = decoded(x.detach().numpy(), "activation"), decoded(layer.weight.detach().numpy(), "weight")
    want = qx @ qw.T
    bound = 96 * 2.0**-24 * (np.abs(qx) @ np.abs(qw).T)
    assert np.all(np.abs(y - want) <= bound)
    assert np.abs(y - want).max() < np.abs(want).max() * 1e-5
    assert not np.array_equal(y, x.detach().numpy().astype(np.float64) @ layer.weight.detach().numpy().T.astype(np.float64))


@pytest.mark.parametrize("preset", ["delayed", "nvfp4"])
def test_a_resumed_layer_continues_bit_for_bit(preset):
    def make():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))

    batches = [(randn(8, 32), randn(8, 16)) for _ in range(8)]

    def train(model, opt, steps):
        losses = []
        for x, t in steps:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), t)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    whole = st.convert(make(), preset)
    assert isinstance(whole[0], st.Linear)  # nvfp4 keeps its last block, whole[2], in high precision
    opt = torch.optim.AdamW(whole.parameters(), lr=1e-2)
    train(whole, opt, batches[:4])
    saved = io.BytesIO()
    torch.save({"model": whole.state_dict(), "opt": opt.state_dict()}, saved)
    rest = train(whole, opt, batches[4:])

    resumed = st.convert(make(), preset)
    opt2 = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    saved.seek(0)
    state = torch.load(saved)
    resumed.load_state_dict(state["model"])
    opt2.load_state_dict(state["opt"])
    assert train(resumed, opt2, batches[4:]) == rest
    assert torch.equal(resumed[0].quantizer_state, whole[0].quantizer_state)
    assert resumed[0].quantizer_state[:, 0].max() > 0  # the quantisers did count steps


def test_gradients_accumulate_as_torch_accumulates():
    layer = st.Linear(16, 8, recipe="current", name="l")
    twin = copy.deepcopy(layer)
    a, b = randn(4, 16), randn(4, 16)
    layer(a).sum().backward()
    layer(b).sum().backward()
    twin(a).sum().backward()
    first = twin.weight.grad.clone()
    twin.weight.grad = None
    twin(b).sum().backward()
    assert torch.equal(layer.weight.grad, first + twin.weight.grad)


def test_no_grad_and_inference_mode_leave_the_state_alone():
    layer = st.Linear(16, 8, recipe="delayed", name="l")
    x = randn(4, 16)
    layer(x.requires_grad_()).sum().backward()
    before = layer.quantizer_state.clone()
    with torch.no_grad():
        a = layer(x)
    with torch.inference_mode():
        b = layer(x)
    layer.eval()
    with torch.no_grad():
        c = layer(x)
    assert torch.equal(layer.quantizer_state, before)
    assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("recipe", ["delayed", "nvfp4"])
def test_eval_mode_leaves_the_state_alone_when_recording_gradients(recipe):
    # model.eval() without no_grad (a validation loss, saliency) used to advance the quantisers:
    # the training after it then differed from a run that never evaluated.
    layer = st.Linear(32, 16, recipe=recipe, name="l")
    x, g = randn(8, 32), randn(8, 16, scale=1e-2)
    layer(x.requires_grad_()).backward(g)
    twin = copy.deepcopy(layer)
    before = layer.quantizer_state.clone()
    layer.eval()
    with torch.no_grad():
        inferred = layer(x)
    xe = x.detach().clone().requires_grad_()
    y = layer(xe)
    y.backward(g)
    assert xe.grad is not None and torch.equal(layer.quantizer_state, before)
    if recipe == "delayed":  # rounds to nearest: the recorded forward is the inference one
        assert torch.equal(y, inferred)
    layer.train()
    for m in (layer, twin):
        m.weight.grad = None
        m(x).backward(g)
    assert torch.equal(layer.weight.grad, twin.weight.grad)
    assert torch.equal(layer.quantizer_state, twin.quantizer_state)


def test_autocast_and_compile_give_the_eager_result():
    layer = st.Linear(32, 16, recipe="mxfp8", name="l")
    x = randn(8, 32)
    with torch.no_grad():
        eager = layer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = layer(x)
        compiled = torch.compile(layer, backend="eager")(x)
    assert autocast.dtype == torch.float32 and torch.equal(autocast, eager)
    assert torch.equal(compiled, eager)


def test_inputs_of_any_layout_and_narrow_dtypes():
    layer = st.Linear(16, 8, recipe="current", name="l")
    x = randn(16, 6)
    with torch.no_grad():
        assert torch.equal(layer(x.t()), layer(x.t().contiguous()))
        bf = layer(x.t().to(torch.bfloat16))
        assert bf.dtype == torch.bfloat16
        assert torch.equal(bf, layer(x.t().to(torch.bfloat16).float()).to(torch.bfloat16))


def test_a_bias_alone_trains():
    layer = st.Linear(8, 4, recipe="current", name="l")
    layer.weight.requires_grad_(False)
    g = randn(3, 4)
    layer(randn(3, 8)).backward(g)
    assert torch.equal(layer.bias.grad, g.double().sum(0).float())


def test_the_state_buffer_must_be_the_layers_own_layout():
    layer = st.Linear(8, 4, recipe="delayed", name="l")
    rows, width = layer.quantizer_state.shape
    layer.quantizer_state = torch.zeros(width, rows, dtype=torch.int64).t()  # not contiguous: a copy would be written
    with pytest.raises(TypeError):
        layer(randn(3, 8).requires_grad_())
    bad = st.Linear(8, 4, recipe="delayed", name="l")
    good = bad.quantizer_state.clone()
    state = bad.state_dict()
    state["quantizer_state"] = good.clone()
    state["quantizer_state"][0, 0] = 5
    state["quantizer_state"][3, 1] = 10**6  # a history longer than any: refused, and nothing loaded
    with pytest.raises(ValueError, match="saved state"):
        bad.load_state_dict(state)
    statistics = {s["operand"]: s["steps"] for s in bad.statistics()}
    assert statistics["weight"] == 0


def test_a_second_backward_through_one_forward_is_refused():
    layer = st.Linear(16, 8, recipe="current", name="l")
    y = layer(randn(2, 16).requires_grad_()).sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already ran"):
        y.backward()


def test_bad_inputs_are_refused_by_name():
    layer = st.Linear(16, 8, recipe="current", name="l")
    with pytest.raises(TypeError, match="float64"):
        layer(torch.zeros(2, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match="int64"):
        layer(torch.zeros(2, 16, dtype=torch.int64))
    with pytest.raises(TypeError, match="CPU.*meta"):
        layer(torch.zeros(2, 16, device="meta"))
    with pytest.raises(ValueError, match="in_features=16"):
        layer(torch.zeros(2, 15))
    with pytest.raises(TypeError, match="recipe"):
        st.Linear(16, 8, recipe=3)
    with pytest.raises(ValueError):
        st.Linear(16, 8, recipe="no_such_recipe")
    with pytest.raises(TypeError, match="float64"):
        st.Linear(16, 8, dtype=torch.float64)


def test_bf16_parameters_train():
    layer = st.Linear(16, 8, recipe="mxfp8", name="l", dtype=torch.bfloat16)
    x = randn(4, 16).to(torch.bfloat16)
    layer(x).float().sum().backward()
    assert layer.weight.grad.dtype == torch.bfloat16 and layer.weight.grad.abs().sum() > 0


class Conv1D(torch.nn.Module):
    """transformers' GPT-2 Conv1D: y = x W + b with W [in, out]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = torch.nn.Parameter(torch.randn(nx, nf, generator=GEN) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], self.nf)


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({"attn": Conv1D(24, 8), "mlp": torch.nn.Linear(24, 8)}) for _ in range(3))
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        for b in self.blocks:
            x = x + b["mlp"](torch.nn.functional.gelu(b["attn"](x)))
        return self.head(x)


def test_convert_swaps_linears_and_conv1d_keeping_parameters():
    model = TinyModel()
    x = randn(4, 8)
    params = {n: p for n, p in model.named_parameters()}
    with torch.no_grad():
        reference = model(x)
    st.convert(model, "current")
    assert {n: p for n, p in model.named_parameters()} == params  # the same Parameter objects
    swapped = {n for n, m in model.named_modules() if isinstance(m, st.Linear)}
    assert swapped == {f"blocks.{i}.{k}" for i in range(3) for k in ("attn", "mlp")}
    assert type(model.head) is torch.nn.Linear  # outside the numbered blocks: high precision, as the trainer's head
    assert model.blocks[0]["attn"].weight_in_out and model.blocks[0]["attn"].name == "blocks.0.attn"
    with torch.no_grad():
        y = model(x)
    assert y.shape == reference.shape and 0 < (y - reference).abs().max() < 0.1 * reference.abs().max()


def test_convert_honours_the_recipes_high_precision_layers_and_the_filter():
    model = st.convert(TinyModel(), "nvfp4")  # keeps its last block in high precision
    swapped = {n for n, m in model.named_modules() if isinstance(m, st.Linear)}
    assert swapped == {f"blocks.{i}.{k}" for i in range(2) for k in ("attn", "mlp")}
    recipe = scalify.preset("mxfp8")
    recipe.high_precision.layers = ["*.attn"]
    recipe.high_precision.first_blocks = 1
    model = st.convert(TinyModel(), recipe, module_filter_fn=lambda m, name: name != "blocks.2.mlp")
    swapped = {n for n, m in model.named_modules() if isinstance(m, st.Linear)}
    assert swapped == {"blocks.1.mlp"}
    with pytest.raises(TypeError, match="Module"):
        st.convert(object(), "current")


def test_convert_names_layers_and_finds_blocks_as_told():
    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    with pytest.warns(RuntimeWarning, match=r"no layer converted: 2 outside any block \(fc1, fc2\).*block_of="):
        st.convert(Mlp(), "current")
    recipe = scalify.preset("current")
    recipe.high_precision.layers = ["mlp.out"]  # the patterns match the layers' given names
    model = st.convert(Mlp(), recipe, block_of=lambda name: 0, name_fn={"fc1": "mlp.fc", "fc2": "mlp.out"}.__getitem__)
    assert isinstance(model.fc1, st.Linear) and model.fc1.name == "mlp.fc" and type(model.fc2) is torch.nn.Linear
    # The name is the stochastic-rounding stream: another model whose layer has the same given name draws the same bits.
    torch.manual_seed(1)
    a = torch.nn.Sequential(torch.nn.Linear(8, 8))
    b = torch.nn.Module()
    b.inner = torch.nn.Linear(8, 8)
    b.inner.load_state_dict(a[0].state_dict())
    sr = scalify.preset("nvfp4_no_hadamard")
    sr.high_precision.last_blocks = 0  # the one block is the last
    a = st.convert(a, sr, block_of=lambda n: 0, name_fn=lambda n: "h0.mlp.fc")
    b = st.convert(b, sr, block_of=lambda n: 0, name_fn=lambda n: "h0.mlp.fc")
    x, g = randn(16, 8), randn(16, 8, scale=1e-2)
    a(x).backward(g)
    b.inner(x).backward(g)
    assert b.inner.name == "h0.mlp.fc" and torch.equal(a[0].weight.grad, b.inner.weight.grad)


def test_convert_swaps_a_shared_layer_everywhere_and_leaves_subclasses():
    class Sub(torch.nn.Linear):
        pass

    shared = torch.nn.Linear(8, 8)
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([torch.nn.Module(), torch.nn.Module()])
    model.blocks[0].fc = model.blocks[1].fc = shared
    model.blocks[1].special = Sub(8, 8)
    st.convert(model, "current")
    assert isinstance(model.blocks[0].fc, st.Linear) and model.blocks[1].fc is model.blocks[0].fc
    assert model.blocks[0].fc.weight is shared.weight and type(model.blocks[1].special) is Sub
    with pytest.warns(RuntimeWarning, match=r"1 subclasses of nn.Linear \(special\)"):
        lone = torch.nn.Module()
        lone.special = Sub(4, 4)
        st.convert(lone, "current")


def test_statistics_report_every_operand():
    model = st.convert(TinyModel(), "current")
    x = randn(4, 8)
    x[0, 0] = 7.5
    model(x.requires_grad_()).sum().backward()
    rows = st.statistics(model)
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    assert len(rows) == 6 * 6
    first = {r["operand"]: r for r in rows if r["layer"] == "blocks.0.attn"}
    assert set(first) == {"weight", "activation", "gradient", "weight_t", "activation_t", "gradient_t"}
    assert first["activation"]["amax"] == 7.5 and first["activation"]["format"] == "e4m3"
    assert first["gradient"]["format"] == "e5m2" and first["gradient"]["steps"] == 1
    for r in rows:
        assert set(r) >= {"amax", "scale", "underflow", "underflow_energy", "clipped", "scaling"}


def test_pickled_and_copied_modules_keep_recipe_and_state():
    layer = st.Linear(16, 8, recipe="delayed", name="l")
    x = randn(4, 16)
    layer(x.requires_grad_()).sum().backward()
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (loaded, copy.deepcopy(layer)):
        assert other.recipe == layer.recipe and other.name == "l"
        assert torch.equal(other.quantizer_state, layer.quantizer_state)
        with torch.no_grad():
            assert torch.equal(other(x), layer(x))


def test_a_state_dict_from_before_conversion_loads():
    plain = TinyModel()
    converted = st.convert(TinyModel(), "current")
    converted.load_state_dict(plain.state_dict())  # weights only: the quantisers keep their state
    assert torch.equal(converted.blocks[0]["mlp"].weight, plain.blocks[0]["mlp"].weight)
    with pytest.raises(RuntimeError, match="blocks.0.mlp.weight"):
        converted.load_state_dict({k: v for k, v in plain.state_dict().items() if k != "blocks.0.mlp.weight"})


class CheckpointedModel(TinyModel):
    """TinyModel with each block under activation checkpointing (torch.utils.checkpoint), as
    transformers' gradient_checkpointing_enable() wraps its blocks."""

    def __init__(self, use_reentrant):
        super().__init__()
        self.use_reentrant = use_reentrant

    def forward(self, x):
        def block(b, x):
            return x + b["mlp"](torch.nn.functional.gelu(b["attn"](x)))
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, b, x, use_reentrant=self.use_reentrant)
        return self.head(x)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("recipe", ["delayed", "nvfp4"])
def test_activation_checkpointing_gives_the_gradients_and_state_of_a_run_without_it(recipe, use_reentrant):
    # The recomputed forward used to quantise again: delayed scaling's scale had moved (other
    # gradients from the first step) and every forward quantiser counted two steps per step.
    torch.manual_seed(3)
    plain = TinyModel()
    checkpointed = CheckpointedModel(use_reentrant)
    checkpointed.load_state_dict(plain.state_dict())
    st.convert(plain, recipe)
    st.convert(checkpointed, recipe)
    runs = []
    for model in (plain, checkpointed):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        grads = []
        for step in range(3):
            x = torch.randn(6, 8, generator=torch.Generator().manual_seed(step), requires_grad=True)
            optimizer.zero_grad()
            model(x).square().mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()] + [x.grad])
            optimizer.step()
        runs.append((grads, [m.quantizer_state.clone() for m in model.modules() if isinstance(m, st.Linear)]))
    (plain_grads, plain_state), (checkpointed_grads, checkpointed_state) = runs
    for step in range(3):
        for a, b in zip(plain_grads[step], checkpointed_grads[step]):
            assert torch.equal(a, b), f"step {step}"
    assert all(torch.equal(a, b) for a, b in zip(plain_state, checkpointed_state))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_inside_an_accumulation_recomputes_each_micro_batch(use_reentrant):
    # The recomputed forward must quantise in its own micro-batch, from the step's start.
    torch.manual_seed(3)
    plain = TinyModel()
    checkpointed = CheckpointedModel(use_reentrant)
    checkpointed.load_state_dict(plain.state_dict())
    runs = []
    for model in (st.convert(plain, "nvfp4"), st.convert(checkpointed, "nvfp4")):
        for step in range(2):
            with st.accumulation(model) as acc:
                for micro in range(2):
                    with acc.micro_batch():
                        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(10 * step + micro), requires_grad=True)
                        model(x).square().mean().backward()
        runs.append([p.grad for p in model.parameters()] + [m.quantizer_state for m in model.modules() if isinstance(m, st.Linear)])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("recipe", ["delayed", "nvfp4"])
def test_checkpointing_a_layer_used_in_two_regions_and_two_forwards_before_one_backward(recipe):
    # One snapshot per layer was overwritten by the second region's forward (and by a second
    # forward before the backward), and a stack of them replayed a region never recomputed (a
    # metric's): each region's recomputation must replay its own first pass.
    torch.manual_seed(4)
    shared = torch.nn.Linear(8, 8)

    def run(checkpointed):
        layer = st.Linear(8, 8, recipe=recipe, name="shared")
        layer.load_state_dict(shared.state_dict(), strict=False)
        region = (lambda f, x: torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False)) if checkpointed else (lambda f, x: f(x))
        losses = []
        for seed in (1, 2):  # two forwards, one backward of their sum
            x = torch.randn(6, 8, generator=torch.Generator().manual_seed(seed), requires_grad=True)
            h = region(lambda t: torch.relu(layer(t)), x)
            losses.append(region(lambda t: layer(t).square(), h).mean())
            _metric = region(lambda t: layer(t * 100).sum(), x)  # recorded, never backpropagated: never recomputed
        (losses[0] + losses[1]).backward()
        return [layer.weight.grad, layer.bias.grad, layer.quantizer_state]

    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))
