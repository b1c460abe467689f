"""Why python/tests/torch_gpt.py builds the engine's GPT from the engine's own ops
(scalify.torch.functional) and not torch's: what torch's ops would cost. The test no longer has a
tolerance (it is bit-exact); this measures the spread it would need without them:

1. torch's f32 ops against the engine's (scalify's Python ops) on model-shaped random inputs;
2. the 1-ulp input-perturbation envelope: every quantised layer's input moved by -1, 0 or +1 ulp
   at random in the torch GPT itself, against the unperturbed torch run (no CLI involved): how
   far one ulp anywhere (such as torch's LayerNorm in place of the engine's) moves training;
3. the torch GPT against `scalify train` (first loss, first-step gradients, 20 losses): 0.

    PYTHONPATH=build-py/pkg SCALIFY_CLI=build/apps/scalify/scalify python bench/torch_gpt_spread.py [--draws 10]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import scalify  # before torch (scalify.torch's OpenMP warning)
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python", "tests"))
import torch_gpt  # noqa: E402
import test_torch_gpt_vs_cli as setup  # noqa: E402  (the test's model, settings and CLI command)


def op_spread() -> None:
    rng = np.random.default_rng(0)
    T = scalify.Tensor

    def report(name, engine, mine):
        a, b = np.asarray(engine, np.float32), np.asarray(mine, np.float32)
        d = np.abs(a - b)
        print(f"  {name}: {np.mean(d > 0) * 100:.0f}% of elements differ, at most "
              f"{d.max() / np.spacing(np.float32(np.abs(b).max())):.1f} ulp of the largest |y|")

    x = rng.standard_normal((256, 64)).astype(np.float32) * 3
    w, b = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32), (0.1 * rng.standard_normal(64)).astype(np.float32)
    h = rng.standard_normal((256, 256)).astype(np.float32) * 2
    a, m = rng.standard_normal((256, 64)).astype(np.float32), (0.02 * rng.standard_normal((64, 256))).astype(np.float32)
    t = rng.integers(0, 256, 256)
    tt = torch.from_numpy
    print("torch's f32 ops against the engine's:")
    report("layer_norm", scalify.layer_norm(T(x), T(w), T(b)), F.layer_norm(tt(x), (64,), tt(w), tt(b), 1e-5))
    report("gelu (tanh)", scalify.gelu(T(h)), F.gelu(tt(h), approximate="tanh"))
    report("softmax", scalify.softmax(T(h)), torch.softmax(tt(h), -1))
    report("exp", scalify.exp(T(h)), torch.exp(tt(h)))
    report("tanh", scalify.tanh(T(h)), torch.tanh(tt(h)))
    report("matmul 256x64x256", scalify.matmul(T(a), T(m)), tt(a) @ tt(m))
    report("cross_entropy", scalify.cross_entropy(T(h), t), F.cross_entropy(tt(h), tt(t)))


def train(recipe, initial, corpus, perturb=None):
    """20 steps of the torch GPT: (losses, AdamW's first moment after step 1)."""
    forward = torch_gpt.EngineLinear.forward
    if perturb is not None:
        def nudged(self, x):
            d = torch.randint(0, 3, x.shape, generator=perturb) - 1
            up, down = torch.nextafter(x, torch.tensor(float("inf"))), torch.nextafter(x, torch.tensor(float("-inf")))
            return forward(self, torch.where(d > 0, up, torch.where(d < 0, down, x)))
        torch_gpt.EngineLinear.forward = nudged
    try:
        model = torch_gpt.TorchGpt(recipe, **setup.MODEL)
        model.load(initial)
        opt = torch_gpt.EngineAdamW(model.params)
        losses, first = [], {}
        for step in range(setup.STEPS):
            ids, targets = scalify.training_batch(step, data=corpus, seed=setup.SEED, batch=setup.BATCH, seq=setup.MODEL["seq"])
            loss = model(torch.from_numpy(ids), torch.from_numpy(targets))
            loss.backward()
            losses.append(loss.item())
            opt.step(torch_gpt.learning_rate(step, lr=setup.LR, min_lr=setup.MIN_LR, warmup=setup.WARMUP, steps=setup.STEPS))
            if step == 0:
                first = {n: v.clone() for n, v in opt.m.items()}
        return np.array(losses, np.float32), first
    finally:
        torch_gpt.EngineLinear.forward = forward


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draws", type=int, default=10, help="perturbation draws per recipe")
    a = p.parse_args()
    op_spread()
    root = tempfile.mkdtemp()
    corpus = os.path.join(root, "text.txt")
    words = "the quick brown fox jumps over the lazy dog while scalify counts every bit of it".split()
    with open(corpus, "w") as f:
        f.write(" ".join(words[(i * 7) % len(words)] for i in range(20000)))
    rel = lambda a, b: max(float((a[n] - b[n]).norm() / b[n].norm()) for n in b)  # noqa: E731
    print("recipe: first loss (ulp), first-step gradients (worst relative norm), 20 losses (worst relative)")
    for recipe in setup.RECIPES:
        run = os.path.join(root, recipe)
        setup.cli_train(run, recipe, setup.STEPS, corpus)
        setup.cli_train(run + "-1", recipe, 1, corpus)
        initial, _ = scalify.load_checkpoint(os.path.join(run, "initial.safetensors"))
        step1, _ = scalify.load_checkpoint(os.path.join(run + "-1", "checkpoint.safetensors"))
        cli_losses = np.array([m["loss"] for m in scalify.read_metrics(run) if "loss" in m], np.float32)
        cli_m = {n[len("optim.m."):]: torch.from_numpy(v) for n, v in step1.items() if n.startswith("optim.m.")}
        losses, m = train(recipe, initial, corpus)
        ulp = np.spacing(losses)
        env = [train(recipe, initial, corpus, torch.Generator().manual_seed(100 + d)) for d in range(a.draws)]
        print(f"  {recipe:8s} vs CLI: {abs(losses[0] - cli_losses[0]) / ulp[0]:.0f} ulp, {rel(m, cli_m):.2e}, "
              f"{np.max(np.abs(losses - cli_losses) / cli_losses):.2e};  envelope: "
              f"{max(abs(l[0] - losses[0]) / ulp[0] for l, _ in env):.0f} ulp, {max(rel(g, m) for _, g in env):.2e}, "
              f"{max(np.max(np.abs(l - losses) / losses) for l, _ in env):.2e}")


if __name__ == "__main__":
    main()
