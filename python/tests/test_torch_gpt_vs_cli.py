"""The engine's GPT written in PyTorch (tests/torch_gpt.py: its block linears
``scalify.torch.Linear`` under the engine's layer names, every other op the engine's own through
``scalify.torch.functional``), trained from ``scalify train --save-initial``'s weights on the
trainer's batches with the trainer's AdamW, against the CLI: bit for bit under f32, current,
delayed, mxfp8 and nvfp4.

- The first step: the loss equals the CLI's; every parameter's gradient equals the engine's own
  model's (``scalify.Gpt`` built with the CLI's settings, whose weights are the CLI's initial
  ones) and, through AdamW's first moment after step 1 (0.1 x the clipped gradient), the CLI's;
  the gradient norm equals the CLI's (an f64 sum of every gradient's squares: one bit off in any
  gradient moves it); every quantiser's state (steps, delayed scaling's scale and amax history)
  equals the CLI's.
- 20 steps: every loss and gradient norm equals the CLI's, and so does every weight at the end.

Measured spread: none (0 ulp in all of the above). What it takes, each measured on this model
(d_model 64, 2 layers, 2 heads, seq 32, batch 8) with torch's own ops in their place:
torch's LayerNorm, softmax attention, tanh-GELU, cross-entropy, head GEMM and embedding backward
differ from the engine's kernels by 1-3 ulp, and under a quantised recipe one ulp at a layer's
input moves a code now and then (first-step gradients then 1e-2 apart, 20 losses 1e-3); torch's
float32 sum for a linear layer's bias gradient rounds differently from the engine's f64 sum in
most elements (scalify.torch.Linear now uses the engine's); torch's sqrt on AVX-512 is not
correctly rounded (the engine's and NumPy's are), so AdamW runs in NumPy; the gradient norm sums
in the engine's order (tests/torch_gpt.py). The residual adds, the embeddings' sum and torch's
sums of a reused tensor's two gradients (the residual stream, the tied wte) are single IEEE
additions, exact in either order."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict, List

import numpy as np
import pytest

import scalify  # before torch: see scalify.torch's warning on torch's OpenMP spinning

torch = pytest.importorskip("torch")
import torch_gpt  # noqa: E402  (python/tests/torch_gpt.py)

CLI = os.environ.get("SCALIFY_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build", "apps", "scalify", "scalify"))
RECIPES = ["f32", "current", "delayed", "mxfp8", "nvfp4"]
MODEL = dict(vocab=256, seq=32, d_model=64, layers=2, heads=2)
STEPS, SEED, BATCH, LR, MIN_LR, WARMUP = 20, 1, 8, 2e-3, 2e-4, 5
SETTINGS = dict(d_model=64, layers=2, heads=2, seq=32, batch=BATCH, seed=SEED, lr=LR, min_lr=MIN_LR, warmup=WARMUP,
                eval_windows=8, eval_every=100, checkpoint_every=100)

pytestmark = pytest.mark.skipif(not os.path.exists(CLI), reason="the CLI is not built (scripts/build.sh)")


def quantizer_states(model: "torch_gpt.TorchGpt") -> Dict[str, Dict[str, Any]]:
    """Every quantiser's state as the CLI's checkpoint keys it ("quant.<layer>.<role>"): steps,
    scale and amax history, decoded from scalify.torch.Linear's quantizer_state rows (steps,
    history length, the scale's f32 bits, the history's f32 bits), one row per operand in the
    order of its statistics()."""
    states: Dict[str, Dict[str, Any]] = {}
    for b in model.blocks:
        for lin in (b.qkv, b.proj, b.fc, b.out):
            if lin.layer is None:
                continue
            rows = lin.layer.quantizer_state.numpy()
            for row, stats in zip(rows, lin.layer.statistics()):
                bits = lambda v: np.asarray(v, dtype=np.int64).astype(np.uint32).view(np.float32)  # noqa: E731
                states[f"quant.{lin.layer.name}.{stats['operand']}"] = dict(
                    steps=int(row[0]), scale=float(bits(row[2])), history=bits(row[3:3 + row[1]]))
    return states


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: Any) -> str:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    words = "the quick brown fox jumps over the lazy dog while scalify counts every bit of it".split()
    path.write_text(" ".join(words[(i * 7) % len(words)] for i in range(20000)))
    return str(path)


def cli_train(out: str, recipe: str, steps: int, corpus: str) -> None:
    sets = [a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")]
    subprocess.run([CLI, "train", "--recipe", recipe, "--steps", str(steps), "--data", corpus, "--out", out, "--save-initial",
                    *sets], check=True, capture_output=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any, corpus: str) -> Dict[str, Dict[str, Any]]:
    """Per recipe: the CLI's 20-step run and its 1-step run (whose checkpoint holds AdamW's first
    moment after step 1: 0.1 x the clipped gradient), the torch model trained alongside, and the
    engine's own model's gradients on the first batch."""
    root = tmp_path_factory.mktemp("runs")
    result: Dict[str, Dict[str, Any]] = {}
    for recipe in RECIPES:
        long_run, one_step = str(root / f"{recipe}-{STEPS}"), str(root / f"{recipe}-1")
        cli_train(long_run, recipe, STEPS, corpus)
        cli_train(one_step, recipe, 1, corpus)
        initial, _ = scalify.load_checkpoint(os.path.join(long_run, "initial.safetensors"))
        final, _ = scalify.load_checkpoint(os.path.join(long_run, "checkpoint.safetensors"))
        step1, meta1 = scalify.load_checkpoint(os.path.join(one_step, "checkpoint.safetensors"))
        model = torch_gpt.TorchGpt(recipe, **MODEL)
        model.load(initial)
        opt = torch_gpt.EngineAdamW(model.params)
        losses: List[float] = []
        for step in range(STEPS):
            ids, targets = scalify.training_batch(step, data=corpus, seed=SEED, batch=BATCH, seq=MODEL["seq"])
            loss = model(torch.from_numpy(ids), torch.from_numpy(targets))
            loss.backward()
            losses.append(loss.item())
            if step == 0:
                gradients = {n: p.grad.clone() for n, p in model.params.items()}
            opt.step(torch_gpt.learning_rate(step, lr=LR, min_lr=MIN_LR, warmup=WARMUP, steps=STEPS))
            if step == 0:
                first_moment = {n: m.clone() for n, m in opt.m.items()}
                quantizers = quantizer_states(model)
        engine = scalify.Gpt(recipe, vocab=MODEL["vocab"], d_model=MODEL["d_model"], layers=MODEL["layers"], heads=MODEL["heads"],
                             seq=MODEL["seq"], seed=SEED)  # the CLI's model and initial weights
        ids, targets = scalify.training_batch(0, data=corpus, seed=SEED, batch=BATCH, seq=MODEL["seq"])
        engine_params = engine.parameters()
        engine_weights = {n: np.asarray(t) for n, t in engine_params.items()}
        engine.loss(ids, targets).backward()
        metrics = [m for m in scalify.read_metrics(long_run) if "loss" in m]
        result[recipe] = dict(initial=initial, final=final, step1=step1, meta1=meta1, model=model, losses=losses,
                              grad_norms=opt.grad_norms, gradients=gradients, first_moment=first_moment,
                              quantizers=quantizers, engine_weights=engine_weights,
                              engine_gradients={n: t.grad for n, t in engine_params.items()},
                              cli_losses=[m["loss"] for m in metrics], cli_grad_norms=[m["grad_norm"] for m in metrics])
    return result


@pytest.mark.parametrize("recipe", RECIPES)
def test_names_and_high_precision_layers_are_the_engines(runs: Dict[str, Dict[str, Any]], recipe: str) -> None:
    run = runs[recipe]
    model: torch_gpt.TorchGpt = run["model"]
    assert {"param." + n for n in model.params} == {k for k in run["initial"] if k.startswith("param.")}
    quantized = {lin.layer.name for b in model.blocks for lin in (b.qkv, b.proj, b.fc, b.out) if lin.layer is not None}
    engine = {k[len("quant."):].rsplit(".", 2)[0] for k in run["step1"] if k.startswith("quant.") and k.endswith(".history")}
    assert quantized == engine
    expected = {"f32": set(), "nvfp4": {f"h0.{n}" for n in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.out")}}
    assert quantized == expected.get(recipe, {f"h{l}.{n}" for l in range(2) for n in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.out")})


@pytest.mark.parametrize("recipe", RECIPES)
def test_first_step_loss_and_gradients_equal_the_clis(runs: Dict[str, Dict[str, Any]], recipe: str) -> None:
    run = runs[recipe]
    assert run["losses"][0] == run["cli_losses"][0]
    assert run["grad_norms"][0] == run["cli_grad_norms"][0]
    assert set(run["gradients"]) == set(run["engine_gradients"])
    for name, grad in run["gradients"].items():
        # The engine's own model starts from the CLI's initial weights (same settings and seed).
        np.testing.assert_array_equal(run["engine_weights"][name], run["initial"]["param." + name], err_msg=name)
        np.testing.assert_array_equal(grad.numpy(), run["engine_gradients"][name], err_msg=name)
        np.testing.assert_array_equal(run["first_moment"][name].numpy(), run["step1"]["optim.m." + name], err_msg=name)


@pytest.mark.parametrize("recipe", RECIPES)
def test_twenty_steps_equal_the_clis(runs: Dict[str, Dict[str, Any]], recipe: str) -> None:
    run = runs[recipe]
    assert len(run["cli_losses"]) == STEPS == len(run["losses"])
    assert run["losses"] == run["cli_losses"]
    assert run["grad_norms"] == run["cli_grad_norms"]
    for name, p in run["model"].params.items():
        np.testing.assert_array_equal(p.detach().numpy(), run["final"]["param." + name], err_msg=name)


@pytest.mark.parametrize("recipe", RECIPES[1:])
def test_quantiser_state_after_the_first_step_is_the_clis(runs: Dict[str, Dict[str, Any]], recipe: str) -> None:
    """Steps, delayed scaling's scale and amax history of every quantiser after step 1 against the
    CLI's step-1 checkpoint."""
    run = runs[recipe]
    cli = json.loads(run["meta1"]["scalify.state"])["quantizers"]
    mine = run["quantizers"]
    assert set(mine) == set(cli)
    for key, state in mine.items():
        assert state["steps"] == cli[key]["steps"], key
        assert state["scale"] == cli[key]["scale"], key
        np.testing.assert_array_equal(state["history"], np.asarray(run["step1"][key + ".history"], dtype=np.float32), err_msg=key)


ACCUM_STEPS = 5


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory: Any, corpus: str) -> Dict[str, Dict[str, Any]]:
    """Per recipe: the CLI's run with `--set accum=2` and the torch model trained alongside, each
    step's two micro-batches inside scalify.torch.accumulation (the trainer's batches step * 2 +
    micro, each loss times 1/2 before its backward)."""
    root = tmp_path_factory.mktemp("accumulated")
    result: Dict[str, Dict[str, Any]] = {}
    for recipe in ("delayed", "nvfp4"):
        run = str(root / recipe)
        sets = [a for k, v in {**SETTINGS, "accum": 2}.items() for a in ("--set", f"{k}={v}")]
        subprocess.run([CLI, "train", "--recipe", recipe, "--steps", str(ACCUM_STEPS), "--data", corpus, "--out", run,
                        "--save-initial", *sets], check=True, capture_output=True)
        initial, _ = scalify.load_checkpoint(os.path.join(run, "initial.safetensors"))
        final, meta = scalify.load_checkpoint(os.path.join(run, "checkpoint.safetensors"))
        model = torch_gpt.TorchGpt(recipe, **MODEL)
        model.load(initial)
        opt = torch_gpt.EngineAdamW(model.params)
        losses: List[float] = []
        for step in range(ACCUM_STEPS):
            micro_losses = []
            with scalify.torch.accumulation(model) as acc:
                for micro in range(2):
                    ids, targets = scalify.training_batch(step * 2 + micro, data=corpus, seed=SEED, batch=BATCH, seq=MODEL["seq"])
                    with acc.micro_batch():
                        loss = model(torch.from_numpy(ids), torch.from_numpy(targets))
                        (loss * 0.5).backward()
                    micro_losses.append(loss.item())
            losses.append((micro_losses[0] + micro_losses[1]) / 2)
            opt.step(torch_gpt.learning_rate(step, lr=LR, min_lr=MIN_LR, warmup=WARMUP, steps=ACCUM_STEPS))
        metrics = [m for m in scalify.read_metrics(run) if "loss" in m]
        result[recipe] = dict(model=model, losses=losses, grad_norms=opt.grad_norms, final=final, meta=meta,
                              quantizers=quantizer_states(model), cli_losses=[m["loss"] for m in metrics],
                              cli_grad_norms=[m["grad_norm"] for m in metrics])
    return result


@pytest.mark.parametrize("recipe", ["delayed", "nvfp4"])
def test_gradient_accumulation_equals_the_clis(accumulated: Dict[str, Dict[str, Any]], recipe: str) -> None:
    """Under `--set accum=2` (delayed scaling records each step's larger amax once; nvfp4's
    stochastic rounding draws each micro-batch's own bits): losses, gradient norms, final weights
    and every quantiser's state equal the CLI's after 5 steps (without the accumulation block
    every one of them differs)."""
    run = accumulated[recipe]
    assert run["losses"] == run["cli_losses"] and run["grad_norms"] == run["cli_grad_norms"]
    for name, p in run["model"].params.items():
        np.testing.assert_array_equal(p.detach().numpy(), run["final"]["param." + name], err_msg=name)
    cli = json.loads(run["meta"]["scalify.state"])["quantizers"]
    assert set(run["quantizers"]) == set(cli)
    for key, state in run["quantizers"].items():
        assert state["steps"] == cli[key]["steps"] in (0, ACCUM_STEPS), key  # 0: an operand reusing another's quantisation
        assert state["scale"] == cli[key]["scale"], key
        np.testing.assert_array_equal(state["history"], np.asarray(run["final"][key + ".history"], dtype=np.float32), err_msg=key)
    assert sum(state["steps"] == ACCUM_STEPS for state in run["quantizers"].values()) >= 4 * 4
