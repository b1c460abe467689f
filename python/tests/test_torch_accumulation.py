"""scalify.torch.accumulation: the micro-batches of one optimizer step quantise as the trainer's
gradient accumulation does (quant::MicroBatchScope): from the state the step started with, with
stochastic-rounding bits of their own, and delayed scaling records the step's amax once, the
largest over its micro-batches. (test_torch_gpt_vs_cli.py checks a whole model against `scalify
train --set accum=2`.)"""

import copy

import pytest

import scalify  # before torch (scalify.torch warns otherwise)

torch = pytest.importorskip("torch")

import scalify.torch as st  # noqa: E402

GEN = torch.Generator().manual_seed(11)


def randn(*shape, scale=1.0):
    return torch.randn(*shape, generator=GEN) * scale


def layer_with_history(recipe="delayed"):
    """A layer one ordinary step into training, so its delayed scale is no longer the initial one."""
    layer = st.Linear(32, 16, recipe=recipe, name="blocks.0.fc")
    with torch.no_grad():
        layer.weight.copy_(randn(16, 32, scale=0.2))
    layer(randn(8, 32, scale=3.0)).sum().backward()
    layer.weight.grad = None
    return layer


def states(layer):
    """Per operand: (steps, the amax history) decoded from the quantizer_state rows."""
    rows = layer.quantizer_state
    bits = rows[:, 3:].to(torch.int32).view(torch.float32)
    return {s["operand"]: (int(r[0]), bits[i, : int(r[1])].tolist()) for i, (r, s) in enumerate(zip(rows, layer.statistics()))}


def test_micro_batches_quantise_from_the_steps_start_and_record_its_largest_amax():
    layer = layer_with_history()
    start = copy.deepcopy(layer)
    a, b = randn(8, 32), randn(8, 32)
    b[2, 5] = 50.0  # b's amax is the step's
    g = randn(8, 16)
    with st.accumulation(layer) as step:
        with step.micro_batch() as i:
            ya = layer(a)
            ya.backward(g)
        with step.micro_batch() as j:
            yb = layer(b)
            yb.backward(g)
        assert (i, j) == (0, 1)
        assert states(layer) == states(start)  # nothing advances before the step ends
    # Each micro-batch quantised with the state the step started with: what a copy of the layer
    # at the step's start gives on it alone (delayed scaling rounds to nearest: no stochastic bits).
    grads = []
    for x in (a, b):
        alone = copy.deepcopy(start)
        y = alone(x)
        y.backward(g)
        grads.append(alone.weight.grad)
        assert torch.equal(y, ya if x is a else yb)
    assert torch.equal(layer.weight.grad, grads[0] + grads[1])
    # One step recorded, with the larger amax of the two micro-batches.
    before, after = states(start), states(layer)
    steps, history = after["activation"]
    assert steps == before["activation"][0] + 1
    assert history == before["activation"][1] + [50.0]
    assert after["weight"][1][-1] == layer.weight.detach().abs().max().item()
    # The output gradient's amax: the larger of the two micro-batches' (the same g in both).
    assert after["gradient"][1] == before["gradient"][1] + [g.abs().max().item()]


def test_each_micro_batch_draws_its_own_stochastic_rounding_bits():
    # nvfp4 rounds the weight gradient GEMM's operands stochastically.
    x, g = randn(16, 32), randn(16, 16, scale=1e-2)

    layer = layer_with_history("nvfp4_no_hadamard")
    fresh = copy.deepcopy(layer)
    grads = []
    with st.accumulation(layer) as step:
        for _ in range(2):
            with step.micro_batch():
                layer(x).backward(g)
            grads.append(layer.weight.grad)
            layer.weight.grad = None
    fresh(x).backward(g)  # one ordinary step from the same state
    assert torch.equal(grads[0], fresh.weight.grad)  # micro-batch 0 draws the bits of the same call outside
    assert not torch.equal(grads[0], grads[1])  # micro-batch 1: the same data, other bits
    assert states(layer) == states(fresh)  # the step counted once, as one ordinary step


def test_an_accumulation_is_used_as_documented():
    layer = layer_with_history()
    before = layer.quantizer_state.clone()
    with pytest.raises(RuntimeError, match="inside `with step.micro_batch"):
        with st.accumulation(layer):
            layer(randn(4, 32))
    assert torch.equal(layer.quantizer_state, before)
    with pytest.raises(ZeroDivisionError):
        with st.accumulation(layer) as step:
            with step.micro_batch():
                layer(randn(4, 32, scale=9.0)).sum().backward()
            1 / 0
    assert torch.equal(layer.quantizer_state, before)  # the step did not happen
    with st.accumulation(layer) as step:
        with torch.no_grad():
            layer(randn(4, 32))  # evaluation between micro-batches is fine
        with pytest.raises(RuntimeError, match="already inside another accumulation"):
            with st.accumulation(layer):
                pass
    with pytest.raises(RuntimeError, match="one object per step"):
        with step:
            pass
    with pytest.raises(RuntimeError, match="runs inside"):
        with st.accumulation(layer).micro_batch():
            pass
    with pytest.raises(TypeError, match="nn.Module"):
        st.accumulation("model")
    assert torch.equal(layer.quantizer_state, before)
    layer(randn(4, 32)).sum().backward()  # outside, each forward is a step again
    assert not torch.equal(layer.quantizer_state, before)


def test_scalify_casts_the_weight_gradient_once_per_accumulated_step():
    """scalify_fp8_3 rounds each weight gradient into E5M2 after backward; under accumulation
    once, on the micro-batches' sum (the trainer's cast_weight_gradients), not on each partial sum."""
    from scalify._scalify import scaled as engine

    def model(recipe):
        torch.manual_seed(0)
        return st.scalify(torch.nn.Sequential(torch.nn.Linear(16, 16)), recipe)

    no_cast = scalify.preset("scalify_fp8_3")
    no_cast.weight_gradient = "f32"  # the same model and sums, never cast
    xs = [randn(4, 16) for _ in range(3)]
    accumulated, uncast = model("scalify_fp8_3"), model(no_cast)
    for m in (accumulated, uncast):
        with st.accumulation(m) as step:
            for x in xs:
                with step.micro_batch():
                    m(x).square().mean().backward()
    for p, q in zip(accumulated.parameters(), uncast.parameters()):
        data, scale = engine.cast_data((q.grad.data_tensor, q.grad.scale), "e5m2")
        assert p.grad.scale == scale and torch.equal(p.grad.data_tensor, data.to(p.grad.data_tensor.dtype))
