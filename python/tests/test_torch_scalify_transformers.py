"""scalify.torch.scalify on Hugging Face transformers models: the tiny random GPT-2, Llama (grouped-
query attention) and causal BERT of test_torch_transformers.py, their parameters ScaledTensors,
train 200 steps with torch's AdamW under SCALIFY FP16 #1 and FP8 #3 with float16 activations and
gradients end to end and no loss scaling, and end within +0.05 nats of the same models in float32;
every aten op they run forward, backward and in the optimizer has its scale rule (no unscaled
fallback). Measured (AMD EPYC, 2 threads): #1 +0.025 / -0.10 / -0.0002, #3 +0.015 / -0.12 /
-0.003 nats (GPT-2 / Llama / BERT; the Llama runs leave the loss plateau earlier than f32's, a
trajectory effect of the first steps' rounding). About 80 s of CPU."""

import collections
import copy
import functools
import math

import numpy as np
import pytest

import scalify  # before torch (scalify.torch warns otherwise)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="needs transformers (scripts/test_python.sh installs it)")

import scalify.torch as st  # noqa: E402
import test_torch_transformers as models  # noqa: E402  (python/tests: the models, batches and loss)

STEPS, WARMUP, TOLERANCE = 200, 10, 0.05


def learning_rate_factor(step):
    if step < WARMUP:
        return (step + 1) / WARMUP
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP)))


def data_dtypes(model, ids):
    """The data dtypes of every module's ScaledTensor outputs on one forward."""
    seen = set()

    def record(module, args, out):
        for t in (out if isinstance(out, tuple) else (out,)):
            if isinstance(t, st.ScaledTensor):
                seen.add(t.data_tensor.dtype)

    hooks = [m.register_forward_hook(record) for m in model.modules()]
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return seen


@functools.lru_cache(maxsize=None)
def trained(name, recipe):
    """(model, held-out loss) after STEPS steps from the seeded initial weights."""
    model = copy.deepcopy(models.initial_model(name))
    if recipe != "f32":
        st.scalify(model, recipe)
    optimizer = torch.optim.AdamW(model.parameters(), lr=models.LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor)
    for step in range(STEPS):
        loss = models.loss_of(model, *models.batch(step))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    with torch.no_grad():
        held_out = float(np.mean([float(models.loss_of(model, *models.batch(i))) for i in models.EVAL_BATCHES]))
    return model, held_out


@pytest.mark.parametrize("recipe", ["scalify_fp16_1", "scalify_fp8_3"])
@pytest.mark.parametrize("name", list(models.MODELS))
def test_scalified_model_trains_in_float16_within_tolerance_of_float32(name, recipe):
    before = st.unhandled_ops()
    model, loss = trained(name, recipe)
    assert st.unhandled_ops() == before, f"{name}: ops without a scale rule"
    params = list(model.parameters())
    master = torch.float32 if recipe == "scalify_fp16_1" else torch.float16
    assert params and all(isinstance(p, st.ScaledTensor) and p.data_tensor.dtype == master for p in params)
    # Cast at use: each gradient comes back in float16 (torch widens it to its float32 parameter's
    # dtype, exactly: the values are float16's; a tied parameter's two uses add in float32).
    uses = collections.Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    # Under #3 each weight gradient is rounded into E5M2 after backward.
    wire = torch.float16 if recipe == "scalify_fp16_1" else torch.float8_e5m2
    for p in params:
        g = p.grad.data_tensor
        assert torch.equal(g.to(wire).to(g.dtype), g) or (recipe == "scalify_fp16_1" and uses[id(p)] > 1)
    assert data_dtypes(model, models.batch(0)[0]) == {torch.float16}
    _, reference = trained(name, "f32")
    assert loss <= reference + TOLERANCE, f"{name} under {recipe}: {loss:.4f} nats, f32 {reference:.4f}"


def test_scalify_keeps_tied_parameters_and_refuses_other_recipes():
    model = copy.deepcopy(models.initial_model("gpt2"))
    count = len(list(model.parameters()))
    st.scalify(model, "scalify_fp16_1")
    assert len(list(model.parameters())) == count
    assert model.lm_head.parametrizations.weight.original is model.transformer.wte.parametrizations.weight.original
    with pytest.raises(ValueError, match="keeps no scaled state"):
        st.scalify(torch.nn.Linear(2, 2), "mxfp8")
    with pytest.raises(TypeError, match="nn.Module"):
        st.scalify("model")


def test_scalify_fp8_4_rebalances_parameters_and_moments_every_100_steps():
    torch.manual_seed(0)
    model = st.scalify(torch.nn.Sequential(torch.nn.Linear(16, 16)), "scalify_fp8_4")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    weight = model[0].weight
    for step in range(100):
        if step == 99:
            before = weight.unscaled().clone()
            with torch.no_grad():  # the data far from unit RMS, so the rescale has work to do
                weight._data.mul_(0.25)
                weight._scale *= 4.0
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    state = optimizer.state[weight]
    assert state["exp_avg"].data_tensor.dtype == torch.float16  # the recipe's optimizer state
    for t in (weight, state["exp_avg"], state["exp_avg_sq"]):
        rms = t.data_tensor.float().square().mean().sqrt().item()
        assert 1.0 <= rms < 2.0, rms  # rebalanced by pow2(rms) after step 100
    assert (weight.unscaled() - before).abs().max() < 0.1  # the value kept (one AdamW step of lr 1e-2 moved it)
