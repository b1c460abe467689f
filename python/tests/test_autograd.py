"""Tensors and autograd from Python: gradients against central differences in f64, SCALIFY's
invariance (a scaled input gives the same values), and the trainer's GPT from Python giving the
CLI's first loss bit for bit."""

import os
import subprocess

import numpy as np
import pytest

import scalify


def mlp_loss(x, w1, w2, targets):
    h = scalify.gelu(x @ w1)
    return scalify.cross_entropy(h @ w2, targets)


def test_gradients_match_central_differences_in_f64():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5))
    w1, w2 = rng.standard_normal((5, 7)) * 0.5, rng.standard_normal((7, 4)) * 0.5
    targets = np.array([0, 3, 1, 2, 3, 0], dtype=np.int64)
    params = [scalify.Tensor(w, requires_grad=True) for w in (w1, w2)]
    loss = mlp_loss(scalify.Tensor(x), *params, targets)
    assert loss.dtype == "f64"
    loss.backward()
    eps = 1e-6
    for p, w in zip(params, (w1, w2)):
        numeric = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            hi, lo = w.copy(), w.copy()
            hi[i] += eps
            lo[i] -= eps
            args = [scalify.Tensor(a) for a in ((hi, w2) if p is params[0] else (w1, hi))]
            f_hi = mlp_loss(scalify.Tensor(x), *args, targets).numpy()
            args = [scalify.Tensor(a) for a in ((lo, w2) if p is params[0] else (w1, lo))]
            f_lo = mlp_loss(scalify.Tensor(x), *args, targets).numpy()
            numeric[i] = (f_hi - f_lo) / (2 * eps)
        assert np.allclose(p.grad, numeric, rtol=1e-6, atol=1e-9)


def test_scaled_tensors_represent_the_unscaled_computation():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 16)).astype(np.float32), (rng.standard_normal((16, 8)) * 0.02).astype(np.float32)
    plain = scalify.gelu(scalify.Tensor(x) @ scalify.Tensor(w, requires_grad=True))
    ws = scalify.as_scaled(w)
    assert ws.scale == 2.0**np.floor(np.log2(np.sqrt(np.mean(w.astype(np.float64) ** 2))))
    scaled = scalify.gelu(scalify.as_scaled(x) @ ws)
    assert scaled.scale is not None and abs(np.sqrt(np.mean(scaled.data**2)) - 1) < 1  # unit-scaled data
    assert np.allclose(scaled.numpy(), plain.numpy(), rtol=1e-5, atol=1e-7)
    scalify.sum(scaled).backward()
    assert ws.grad_scale is not None and ws.grad.shape == w.shape
    same = scalify.set_scaling(ws, 0.5)  # a no-op on the value
    assert np.array_equal(same.numpy(), ws.numpy()) and same.scale == 0.5


CLI = os.environ.get("SCALIFY_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build", "apps", "scalify", "scalify"))


@pytest.mark.skipif(not os.path.exists(CLI), reason="the CLI is not built (scripts/build.sh)")
def test_the_gpt_from_python_gives_the_clis_first_loss(tmp_path):
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(chr(97 + (i * i) % 26) for i in range(30000)))
    settings = dict(data=str(corpus), d_model=32, layers=2, heads=2, seq=16, batch=4, seed=7)
    for recipe in ("f32", "current"):
        ids, targets = scalify.training_batch(0, **settings)
        model = scalify.Gpt(recipe, **settings)
        loss = model.loss(ids, targets)
        sets = [a for k, v in settings.items() if k != "data" for a in ("--set", f"{k}={v}")]
        subprocess.run([CLI, "train", "--recipe", recipe, "--steps", "1", "--data", str(corpus), "--out", str(tmp_path / recipe), *sets],
                       check=True, capture_output=True)
        first = [m["loss"] for m in scalify.read_metrics(str(tmp_path / recipe)) if "loss" in m][0]
        assert float(loss.numpy()) == first, recipe
        loss.backward()  # every parameter receives its gradient, shaped as the parameter
        for name, p in model.parameters().items():
            assert p.grad is not None and p.grad.shape == p.shape, name


def test_unit_scaled_ops_keep_unit_variance():
    rng = np.random.default_rng(4)
    rms = lambda a: float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))  # noqa: E731
    x = scalify.Tensor(rng.standard_normal((512, 256)).astype(np.float32), requires_grad=True)
    w = scalify.Tensor(rng.standard_normal((256, 128)).astype(np.float32), requires_grad=True)
    y = scalify.unit.matmul(x, w, constrain="none")
    scalify.sum(y * scalify.Tensor(rng.standard_normal((512, 128)).astype(np.float32))).backward()
    # Table A.2: unit-variance inputs give an output and gradients of unit RMS, within this size's
    # sampling spread (measured 0.997, 0.993, 1.002).
    assert abs(rms(y.numpy()) - 1) < 0.03 and abs(rms(x.grad) - 1) < 0.03 and abs(rms(w.grad) - 1) < 0.03
    # Constrained x: one factor (m n)^-1/4 for the output and the input gradient, so the output's
    # RMS is (m / n)^1/4 = 2^1/4 here (measured 1.186).
    assert abs(rms(scalify.unit.matmul(x, w).numpy()) - 2**0.25) < 0.03
    assert abs(rms(scalify.unit.gelu(y).numpy()) - 1) < 0.15  # measured 1.10
    with pytest.raises(ValueError, match="constrain must be"):
        scalify.unit.matmul(x, w, constrain="sideways")
