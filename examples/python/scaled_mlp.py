"""A two-layer MLP written by hand on SCALIFY's scaled tensors: weights and inputs as scaled f16
(unit-RMS data, power-of-two scales), every op propagating the scales, gradients coming back
scaled. Trains a toy regression-as-classification task with plain SGD, and prints the loss beside
an f32 run of the same model. Run: python examples/python/scaled_mlp.py"""

from typing import Optional

import numpy as np

import scalify

rng = np.random.default_rng(0)
n, d, h, k = 256, 16, 64, 4
x = rng.standard_normal((n, d)).astype(np.float32)
targets = np.argmax(x[:, :k] + 0.3 * rng.standard_normal((n, k)), axis=1).astype(np.int64)


def train(scaled: bool, steps: int = 200, lr: float = 0.5) -> tuple[list[float], tuple[str, Optional[float], Optional[float]]]:
    init = np.random.default_rng(1)  # the same initial weights for both runs
    w1 = (init.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32)
    w2 = (init.standard_normal((h, k)) / np.sqrt(h)).astype(np.float32)
    losses: list[float] = []
    for _ in range(steps):
        if scaled:  # f16 data with power-of-two scales; the ops propagate them
            xs, p1, p2 = scalify.as_scaled(x, "f16", False), scalify.as_scaled(w1, "f16"), scalify.as_scaled(w2, "f16")
        else:
            xs, p1, p2 = scalify.Tensor(x), scalify.Tensor(w1, requires_grad=True), scalify.Tensor(w2, requires_grad=True)
        loss = scalify.cross_entropy(scalify.gelu(xs @ p1) @ p2, targets)
        loss.backward()
        losses.append(loss.item())
        assert p1.grad is not None and p2.grad is not None  # set by backward()
        w1 -= lr * p1.grad  # the gradients' represented values (data x propagated scale)
        w2 -= lr * p2.grad
    return losses, (p1.dtype, p1.scale, p1.grad_scale)


f32, _ = train(False)
f16, (dtype, scale, grad_scale) = train(True)
print(f"f32:    loss {f32[0]:.3f} -> {f32[-1]:.3f}")
print(f"scaled: loss {f16[0]:.3f} -> {f16[-1]:.3f}  (w1 data stored as {dtype}, scale {scale}, gradient scale {grad_scale})")
