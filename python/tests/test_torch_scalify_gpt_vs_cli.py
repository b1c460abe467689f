"""The engine's GPT written in plain PyTorch (F.embedding, nn.LayerNorm, F.gelu(approximate="tanh"),
``@``, F.cross_entropy; the block linears ``scalify.torch.Linear`` under the engine's names; the
attention ``scalify.torch.functional.causal_self_attention``, the engine's fused kernel) under
``scalify.torch.scalify(model, recipe)``, against ``scalify train --recipe scalify_fp16_1`` and
``scalify_fp8_3`` from the same (``--save-initial``) weights on the same batches.

- Parameters: scalify() on the CLI's initial weights (float32 values) gives each parameter the
  engine's data and scale (prepare_parameters' as_scaled into the master storage).
- The first step: the loss equals the CLI's; every activation's scale and every activation
  gradient's, parameter's and parameter gradient's scale (110 tensors) equal
  ``scalify.inspect(run, initial=True, batch=0)``'s, which runs the trainer's batch 0 (the batch
  this test trains on first: its loss is the CLI's first). inspect runs the model with a probe,
  and a probed engine GPT composes its attention from the scaled ops (to tap the scores and
  probabilities) where training takes the fused kernel (nn/attention.cpp): the torch model
  composes it too for that comparison (``attention="composed"``: q @ k^T / sqrt(head width),
  masked_fill, softmax, @ v, each by its rule). Training's fused attention gives every scale alike but on the
  attention's backward path: its gradient rule puts qkv's gradient 2^3 above the composed ops',
  and so the gradients before it in the block (ln1's input, ln1's and qkv's parameters, and
  proj's weight, whose gradient reads the attention's output).
- 20 steps with the engine's scaled AdamW written here (``ScaledAdamW``: optim/adamw.cpp's
  step_scaled on the bindings' mul / ema / cast_data, the update on represented values in
  float32, the parameter's scale restored): every loss and gradient norm equals the CLI's, and so
  does every parameter's data and scale at the end.

Measured spread: none (0 ulp in all of the above, both recipes). What it takes: the optimizer
reads the gradient into float32 before the clipping multiplier and the square (the engine's
kernels compute them in float32; through the bindings on float16 data they round into float16:
20 losses then 3e-3 apart under scalify_fp8_3); the tied wte read once per forward (see
ScaledGpt.forward: read twice under scalify_fp16_1's cast-at-use parametrization, torch adds the
head's gradient into the embedding's in place, keeping the first's scale: the first gradient
norm 5e-6 off, 20 losses 5e-5)."""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest

import scalify  # before torch: see scalify.torch's warning on torch's OpenMP spinning

torch = pytest.importorskip("torch")
import scalify.torch  # noqa: E402
import scalify.torch.functional as SF  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_gpt  # noqa: E402  (python/tests/torch_gpt.py)
from scalify._scalify import scaled as engine  # noqa: E402
from scalify.torch import ScaledTensor  # noqa: E402
from test_torch_gpt_vs_cli import BATCH, CLI, LR, MIN_LR, MODEL, SEED, STEPS, WARMUP, cli_train, corpus  # noqa: E402,F401

RECIPES = ["scalify_fp16_1", "scalify_fp8_3"]

pytestmark = pytest.mark.skipif(not os.path.exists(CLI), reason="the CLI is not built (scripts/build.sh)")

Tap = Callable[[Any, str], Any]


class Block(torch.nn.Module):
    def __init__(self, recipe: scalify.Recipe, l: int, layers: int, d: int) -> None:
        super().__init__()

        def linear(short: str, d_in: int, d_out: int) -> scalify.torch.Linear:
            name = f"h{l}.{short}"
            return scalify.torch.Linear(d_in, d_out, recipe=scalify._scalify.linear_recipe_for(recipe, name, l, layers), name=name,
                                        weight_in_out=True)

        self.ln1, self.ln2 = torch.nn.LayerNorm(d, eps=1e-5), torch.nn.LayerNorm(d, eps=1e-5)
        self.qkv, self.proj = linear("attn.qkv", d, 3 * d), linear("attn.proj", d, d)
        self.fc, self.out = linear("mlp.fc", d, 4 * d), linear("mlp.out", 4 * d, d)


class ScaledGpt(torch.nn.Module):
    """The engine's GPT (src/scalify/nn/gpt.cpp: learned positions, pre-LayerNorm blocks, tanh-GELU
    MLP, the head tied to wte) in torch ops; ``tap(tensor, name)`` sees each activation the
    engine's probe taps, under the engine's name."""

    def __init__(self, recipe: str, *, vocab: int, seq: int, d_model: int, layers: int, heads: int,
                 attention: str = "fused") -> None:
        super().__init__()
        whole = scalify.preset(recipe)
        self.heads, self.attention = heads, attention
        self.wte = torch.nn.Parameter(torch.empty(vocab, d_model))
        self.wpe = torch.nn.Parameter(torch.empty(seq, d_model))
        self.blocks = torch.nn.ModuleList(Block(whole, l, layers, d_model) for l in range(layers))
        self.lnf = torch.nn.LayerNorm(d_model, eps=1e-5)

    def places(self) -> Dict[str, Tuple[torch.nn.Module, str]]:
        """Engine parameter name -> (module, attribute), in nn::Gpt::refs()'s order (the gradient
        norm's)."""
        out: Dict[str, Tuple[torch.nn.Module, str]] = {"wte": (self, "wte"), "wpe": (self, "wpe")}
        for l, b in enumerate(self.blocks):
            for short, module in (("ln1", b.ln1), ("attn.qkv", b.qkv), ("attn.proj", b.proj), ("ln2", b.ln2), ("mlp.fc", b.fc),
                                  ("mlp.out", b.out)):
                out[f"h{l}.{short}.w"], out[f"h{l}.{short}.b"] = (module, "weight"), (module, "bias")
        out["lnf.w"], out["lnf.b"] = (self.lnf, "weight"), (self.lnf, "bias")
        return out

    def load(self, tensors: Dict[str, np.ndarray]) -> None:
        """The CLI checkpoint's parameters as float32 values (data times scale)."""
        with torch.no_grad():
            for name, (module, attr) in self.places().items():
                value = np.asarray(tensors["param." + name], dtype=np.float32) * np.float32(tensors["param." + name + ".scale"])
                getattr(module, attr).copy_(torch.from_numpy(value))

    def parameters_by_name(self) -> Dict[str, torch.nn.Parameter]:
        """Engine name -> the Parameter holding it (under a parametrization, its stored original)."""
        out = {}
        for name, (module, attr) in self.places().items():
            if torch.nn.utils.parametrize.is_parametrized(module, attr):
                out[name] = getattr(module.parametrizations, attr).original
            else:
                out[name] = getattr(module, attr)
        return out

    def _attend(self, qkv: Any, tap: Tap, prefix: str) -> Any:
        if self.attention == "fused":
            return SF.causal_self_attention(qkv, self.heads)
        B, T, D3 = qkv.shape
        D, H = D3 // 3, self.heads
        q, k, v = (t.reshape(B, T, H, D // H).transpose(1, 2) for t in qkv.split(D, dim=-1))
        scores = tap((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H)), prefix + "attn.scores (masked)")
        probs = tap(scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1), prefix + "attn.probs")
        return tap((probs @ v).transpose(1, 2).reshape(B, T, D), prefix + "attn.mix")

    def forward(self, ids: torch.Tensor, targets: torch.Tensor, tap: Optional[Tap] = None) -> Any:
        t: Tap = tap or (lambda x, name: x)
        B, T = ids.shape
        positions = torch.arange(T).repeat(B, 1)  # one row per batch row, as nn::Gpt::logits
        # The tied wte read once: its gradient's two terms (embedding, head) then meet in one add rule, as
        # the engine's. Read twice under scalify()'s cast-at-use parametrization, each read a cast of its
        # own, torch would add the second term into the first in place (AccumulateGrad's +=), and an
        # in-place add keeps the target's scale.
        wte = self.wte
        x = t(F.embedding(ids, wte) + F.embedding(positions, self.wpe), "embed")
        for l, b in enumerate(self.blocks):
            p = f"h{l}."
            qkv = t(b.qkv(t(b.ln1(x), p + "ln1")), p + "attn.qkv")
            x = t(x + t(b.proj(self._attend(qkv, t, p)), p + "attn.out"), p + "resid.attn")
            h = t(b.fc(t(b.ln2(x), p + "ln2")), p + "mlp.fc")
            x = t(x + t(b.out(t(F.gelu(h, approximate="tanh"), p + "mlp.gelu")), p + "mlp.out"), p + "resid.mlp")
        logits = t(t(self.lnf(x), "lnf") @ wte.t(), "logits")
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def _log2(scale: float) -> float:
    return math.log2(scale)


class ScaledAdamW:
    """optim/adamw.cpp's AdamW on scaled parameters (step_scaled; its fused form gives the same
    bits), after grad_norm.cpp's global norm and the trainer's clipping multiplier: the gradient
    times the multiplier by the engine's mul_scalar rule, the moments by its ema rule with their
    data in the recipe's state storage, the update computed on represented values in float32
    (NumPy: a correctly rounded sqrt, as the engine's), the new value restored into the
    parameter's own scale and storage."""

    def __init__(self, params: Dict[str, torch.nn.Parameter], *, state: str, beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8, weight_decay: float = 0.1, grad_clip: float = 1.0) -> None:
        self.params, self.state = params, state
        self.beta1, self.beta2, self.eps, self.wd, self.clip = beta1, beta2, eps, weight_decay, grad_clip
        zeros = {n: (torch.zeros(p.shape, dtype=torch.float32), 0.0) for n, p in params.items()}  # ANY: zeros
        self.m: Dict[str, Any] = dict(zeros)
        self.v: Dict[str, Any] = dict(zeros)
        self.t = 0
        self.grad_norms: List[float] = []

    @torch.no_grad()
    def step(self, lr: float) -> None:
        grads = {n: p.grad for n, p in self.params.items()}
        norm = math.sqrt(torch_gpt.gradient_sum_squares([g.data_tensor.double() * g.scale for g in grads.values()]))
        self.grad_norms.append(norm)
        f = np.float32
        multiplier = self.clip / norm if self.clip > 0 and norm > self.clip else 1.0
        self.t += 1
        bc1, bc2 = 1 - self.beta1 ** self.t, 1 - self.beta2 ** self.t
        ibc1, ibc2, eps, lr32, wd = f(1 / bc1), f(1 / bc2), f(self.eps), f(lr), f(self.wd)
        for n, p in self.params.items():
            # Read through its storage into float32, as the engine's kernels read it: the multiplied
            # gradient and its square stay float32 (the bindings round an output into its inputs' storage).
            g = (grads[n].data_tensor.to(torch.float32).contiguous(), grads[n].scale)
            if multiplier != 1.0:
                g = engine.scalar("mul", g, multiplier)
            self.m[n] = engine.cast_data(engine.ema(self.m[n], g, self.beta1), self.state)
            self.v[n] = engine.cast_data(engine.ema(self.v[n], engine.binary("mul", g, g), self.beta2), self.state)
            m = self.m[n][0].to(torch.float32).numpy() * f(self.m[n][1])
            v = self.v[n][0].to(torch.float32).numpy() * f(self.v[n][1])
            update = (m * ibc1) / (np.sqrt(v * ibc2) + eps)
            ps = f(p.scale)
            w = p.data_tensor.to(torch.float32).numpy() * ps
            if torch_gpt.decays(n):
                update = update + w * wd
            data = torch.from_numpy((w - update * lr32) / ps)  # the parameter's scale kept: exact division by a power of two
            p.data_tensor.copy_(data.to(p.data_tensor.dtype))  # rounded into its storage (nearest even)
            p.grad = None


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any, corpus: str) -> Dict[str, Dict[str, Any]]:
    root = tmp_path_factory.mktemp("scalify-runs")
    fallbacks = scalify.torch.unhandled_ops()
    result: Dict[str, Dict[str, Any]] = {}
    for recipe in RECIPES:
        run = str(root / recipe)
        cli_train(run, recipe, STEPS, corpus)
        initial, _ = scalify.load_checkpoint(os.path.join(run, "initial.safetensors"))
        inspected = scalify.inspect(run, initial=True, batch=0, data=corpus)["tensors"]
        cli = {(t["kind"], t["name"]): t["scale_log2"] for t in inspected}
        metrics = [m for m in scalify.read_metrics(run) if "loss" in m]
        ids, targets = (torch.from_numpy(a) for a in scalify.training_batch(0, data=corpus, seed=SEED, batch=BATCH, seq=MODEL["seq"]))

        # The first step's scales, with the composed attention the probed engine runs, and the fused.
        first: Dict[str, Dict[Tuple[str, str], float]] = {}
        first_loss: Dict[str, float] = {}
        for attention in ("composed", "fused"):
            model = scalified_gpt(recipe, initial, attention)
            scales: Dict[Tuple[str, str], float] = {}

            def tap(x: Any, name: str, scales: Dict[Tuple[str, str], float] = scales) -> Any:
                scales[("activation", name)] = _log2(x.scale)
                x.register_hook(lambda g: scales.__setitem__(("activation_grad", name), _log2(g.scale)))
                return x

            loss = model(ids, targets, tap)
            loss.backward()
            first_loss[attention] = loss.item()
            for name, p in model.parameters_by_name().items():
                scales[("weight", name)] = _log2(p.scale)
                scales[("weight_grad", name)] = _log2(p.grad.scale)
            first[attention] = scales
        params = {n: (p.data_tensor.clone(), p.scale) for n, p in scalified_gpt(recipe, initial).parameters_by_name().items()}

        # 20 steps: the fused attention, as the trainer runs.
        model = scalified_gpt(recipe, initial)
        opt = ScaledAdamW(model.parameters_by_name(), state=str(scalify.preset(recipe).optimizer_state))
        losses: List[float] = []
        for step in range(STEPS):
            ids, targets = (torch.from_numpy(a) for a in
                            scalify.training_batch(step, data=corpus, seed=SEED, batch=BATCH, seq=MODEL["seq"]))
            loss = model(ids, targets)
            loss.backward()
            losses.append(loss.item())
            opt.step(torch_gpt.learning_rate(step, lr=LR, min_lr=MIN_LR, warmup=WARMUP, steps=STEPS))
        final, _ = scalify.load_checkpoint(os.path.join(run, "checkpoint.safetensors"))
        final_params = {n: (p.data_tensor.clone(), p.scale) for n, p in model.parameters_by_name().items()}
        result[recipe] = dict(initial=initial, cli=cli, first=first, first_loss=first_loss, params=params, losses=losses,
                              final=final, final_params=final_params,
                              grad_norms=opt.grad_norms, cli_losses=[m["loss"] for m in metrics],
                              cli_grad_norms=[m["grad_norm"] for m in metrics])
    assert scalify.torch.unhandled_ops() == fallbacks  # every op the model ran had its rule
    return result


def scalified_gpt(recipe: str, initial: Dict[str, np.ndarray], attention: str = "fused") -> ScaledGpt:
    """The torch GPT with the CLI's initial weights, under scalify(model, recipe)."""
    model = ScaledGpt(recipe, **MODEL, attention=attention)
    model.load(initial)
    scalify.torch.scalify(model, recipe)
    return model


@pytest.mark.parametrize("recipe", RECIPES)
def test_scalify_gives_the_engines_parameters(runs: Dict[str, Dict[str, Any]], recipe: str) -> None:
    run = runs[recipe]
    master = {"f32": torch.float32, "f16": torch.float16}[str(scalify.preset(recipe).master_weight)]
    assert {"param." + n for n in run["params"]} == {k for k in run["initial"] if k.startswith("param.") and not k.endswith(".scale")}
    for name, (data, scale) in run["params"].items():
        assert data.dtype == master, name
        assert scale == run["initial"]["param." + name + ".scale"], name
        np.testing.assert_array_equal(data.to(torch.float32).numpy(), run["initial"]["param." + name], err_msg=name)


@pytest.mark.parametrize("recipe", RECIPES)
def test_first_step_loss_and_every_scale_equal_the_clis(runs: Dict[str, Dict[str, Any]], recipe: str) -> None:
    run = runs[recipe]
    assert run["first_loss"]["fused"] == run["cli_losses"][0]
    composed, cli = run["first"]["composed"], run["cli"]
    # Activations and their gradients: embed, 12 per block, lnf, logits; parameters and their
    # gradients: wte, wpe, 12 per block, lnf's two.
    assert len(cli) == 2 * (3 + 12 * MODEL["layers"]) + 2 * (4 + 12 * MODEL["layers"])
    assert set(composed) == set(cli)
    assert {k: (v, cli[k]) for k, v in composed.items() if cli[k] != v} == {}
    # Training's fused attention: the same scales everywhere but on the attention's backward path,
    # where the fused kernel's gradient rule (rules::attention_grad) puts qkv's gradient 2^3 above
    # the composed ops' (and so the gradients of everything before it in the block).
    fused = run["first"]["fused"]
    inside = {(kind, f"h{l}.attn.{t}") for kind in ("activation", "activation_grad") for l in range(MODEL["layers"])
              for t in ("scores (masked)", "probs", "mix")}
    assert set(composed) - set(fused) == inside
    moved = {("activation_grad", f"h{l}.{n}") for l in range(MODEL["layers"]) for n in ("attn.qkv", "ln1")} | {
        ("weight_grad", f"h{l}.{n}") for l in range(MODEL["layers"]) for n in ("ln1.w", "ln1.b", "attn.qkv.w", "attn.qkv.b", "attn.proj.w")}
    assert {k: v - composed[k] for k, v in fused.items() if composed[k] != v} == {k: 3.0 for k in moved}


@pytest.mark.parametrize("recipe", RECIPES)
def test_twenty_steps_equal_the_clis(runs: Dict[str, Dict[str, Any]], recipe: str) -> None:
    run = runs[recipe]
    assert len(run["cli_losses"]) == STEPS == len(run["losses"])
    assert run["losses"] == run["cli_losses"]
    assert run["grad_norms"] == run["cli_grad_norms"]
    for name, (data, scale) in run["final_params"].items():
        assert scale == run["final"]["param." + name + ".scale"], name
        np.testing.assert_array_equal(data.to(torch.float32).numpy(), run["final"]["param." + name], err_msg=name)


@pytest.mark.parametrize("recipe,rtol", [("scalify_fp16_1", 2.0**-15), ("scalify_fp8_3", 2.0**-9)])
def test_twenty_steps_with_torchs_adamw_stay_near_the_clis(runs: Dict[str, Dict[str, Any]], corpus: str, recipe: str,
                                                             rtol: float) -> None:
    """torch.optim.AdamW on the scalified parameters (the engine's decay groups and clipping, the
    gradients times 1 / norm in place) in place of the engine's scaled AdamW. Measured: the 20
    losses within 2.1e-5 relative of the CLI's under scalify_fp16_1 (below float16's 2^-11) and
    1.5e-3 under scalify_fp8_3 (3 float16 ulp; not isolated further: torch's AdamW is separate
    in-place ops, each rounding into the float16 master weight, the decay and then the update,
    where the engine's update rounds once)."""
    run = runs[recipe]
    model = scalified_gpt(recipe, run["initial"])
    named = model.parameters_by_name()
    opt = torch.optim.AdamW([dict(params=[p for n, p in named.items() if torch_gpt.decays(n)], weight_decay=0.1),
                             dict(params=[p for n, p in named.items() if not torch_gpt.decays(n)], weight_decay=0.0)],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    losses = []
    for step in range(STEPS):
        ids, targets = (torch.from_numpy(a) for a in scalify.training_batch(step, data=corpus, seed=SEED, batch=BATCH, seq=MODEL["seq"]))
        loss = model(ids, targets)
        loss.backward()
        losses.append(loss.item())
        norm = math.sqrt(torch_gpt.gradient_sum_squares([p.grad.data_tensor.double() * p.grad.scale for p in named.values()]))
        with torch.no_grad():
            for p in named.values():
                p.grad.mul_(min(1.0, 1.0 / norm))
        for group in opt.param_groups:
            group["lr"] = torch_gpt.learning_rate(step, lr=LR, min_lr=MIN_LR, warmup=WARMUP, steps=STEPS)
        opt.step()
        opt.zero_grad()
    assert losses[0] == run["cli_losses"][0]
    np.testing.assert_allclose(losses, run["cli_losses"], rtol=rtol, atol=0)
    assert losses != run["cli_losses"]  # the engine's optimizer is not torch's


def test_causal_self_attention_on_a_scaled_tensor_is_the_engines_fused_attention() -> None:
    """SF.causal_self_attention on a ScaledTensor: the engine's scaled fused attention (its output
    pair and, through torch's autograd, its backward's), whose value is attention's in float64
    within float16 rounding."""
    B, T, D, H, scale = 2, 5, 8, 2, 2.0**-3
    gen = torch.Generator().manual_seed(5)
    data = torch.randn(B, T, 3 * D, generator=gen, dtype=torch.float64).to(torch.float16)
    qkv = ScaledTensor(data, scale, requires_grad=True)
    y = SF.causal_self_attention(qkv, H)
    (ey, escale), probs = engine.causal_attention((data, scale), H)
    assert isinstance(y, ScaledTensor) and y.scale == escale and y.dtype == torch.float16
    torch.testing.assert_close(y.data_tensor, ey, rtol=0, atol=0)
    g = torch.randn(B, T, D, generator=gen, dtype=torch.float64).to(torch.float16)
    y.backward(ScaledTensor(g, 2.0**-7))
    dq, dscale = engine.causal_attention_backward((data, scale), probs, (g, 2.0**-7), H)
    assert qkv.grad.scale == dscale
    torch.testing.assert_close(qkv.grad.data_tensor, dq, rtol=0, atol=0)

    x = (data.double() * scale).requires_grad_(True)
    q, k, v = (t.reshape(B, T, H, D // H).transpose(1, 2) for t in x.split(D, -1))
    s = (q @ k.transpose(-1, -2) / math.sqrt(D // H)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    ref = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, D)
    value = y.data_tensor.double() * y.scale
    torch.testing.assert_close(value, ref, rtol=2.0**-9, atol=2.0**-9 * ref.abs().max().item())
    ref.backward(g.double() * 2.0**-7)
    grad = qkv.grad.data_tensor.double() * qkv.grad.scale
    torch.testing.assert_close(grad, x.grad, rtol=2.0**-8, atol=2.0**-8 * x.grad.abs().max().item())


def test_causal_self_attention_rejects_a_bad_scaled_qkv() -> None:
    with pytest.raises(ValueError, match="qkv must be"):
        SF.causal_self_attention(ScaledTensor(torch.zeros(2, 5, 10, dtype=torch.float16), 1.0), 2)
    with pytest.raises(TypeError, match="heads is an int"):
        SF.causal_self_attention(ScaledTensor(torch.zeros(2, 5, 12, dtype=torch.float16), 1.0), 2.0)  # type: ignore[arg-type]
