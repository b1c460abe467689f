"""scalify.torch.Linear's forward + backward at GPT-2 shapes against torch's own nn.Linear, in one
process, alternating: for each shape, `--rounds` rounds of every contender in turn (the order
reversed every other round), each timed over `--iters` iterations after one warm-up; the ratio per
round, then its median. Contenders: nn.Linear f32, nn.Linear under torch.autocast(bfloat16),
scalify.torch.Linear under each recipe, and the engine's layer alone on the same arrays (no
module, no autograd.Function), its two gradients added into torch tensors as autograd accumulates
the modules' (x.grad, weight.grad): the bridge's overhead (DLPack, Python, layouts) is the
module's time over it, printed per recipe under the table. Every layer
has no bias (a bias costs each contender one pass over the output and one over its gradient; the
engine's layer here has none).

    python bench/torch_linear.py --threads 2 --rounds 5     (needs torch; prints a Markdown table)
"""
import argparse
import statistics
import time

import scalify  # before torch: both libraries' OpenMP threads then wait briefly (scalify.torch warns otherwise)
import scalify.torch as st
import torch
from scalify import _scalify

SHAPES = [(768, 3072), (3072, 768)]


def timed(fn, iters):
    fn()  # warm-up: buffers, oneDNN primitives
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=8 * 1024)
    p.add_argument("--recipes", default="current,mxfp8")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch and OpenMP threads (0: as set)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, tokens {a.tokens}")
    print("\n| shape | contender | ms (median) | vs nn.Linear f32 |\n|---|---|---|---|")
    overheads = []
    for n_in, n_out in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(a.tokens, n_in, requires_grad=True)
        g = torch.randn(a.tokens, n_out) * 1e-3
        reference = torch.nn.Linear(n_in, n_out, bias=False)
        contenders = {"nn.Linear f32": lambda: reference(x).backward(g)}

        def autocast():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = reference(x)
            y.backward(g.to(y.dtype))

        contenders["nn.Linear autocast bf16"] = autocast
        for name in a.recipes.split(","):
            layer = st.Linear(n_in, n_out, bias=False, recipe=name, name="bench")
            contenders[f"scalify.torch {name}"] = lambda layer=layer: layer(x).backward(g)
            engine = _scalify.QuantizedLinear(scalify.preset(name).linear, "bench")
            xs, ws, gs = x.detach().numpy(), layer.weight.detach().t().contiguous().numpy(), g.numpy()
            x_grad, w_grad = torch.zeros_like(x), torch.zeros_like(layer.weight)

            def engine_step(engine=engine, xs=xs, ws=ws, gs=gs, x_grad=x_grad, w_grad=w_grad):
                dx, dw = engine.forward(xs, ws, True)[1].backward(gs)
                x_grad.add_(torch.from_numpy(dx))
                w_grad.add_(torch.from_numpy(dw).t())  # the engine's [in, out] into torch's [out, in]

            contenders[f"engine layer {name}"] = engine_step
        times = {k: [] for k in contenders}
        for r in range(a.rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for k in order:
                times[k].append(timed(contenders[k], a.iters))
        base = times["nn.Linear f32"]
        for k, ts in times.items():
            ratio = statistics.median(t / b for t, b in zip(ts, base))
            print(f"| {n_in}->{n_out} | {k} | {statistics.median(ts) * 1e3:.1f} | {ratio:.2f} |")
        for name in a.recipes.split(","):
            module, engine = times[f"scalify.torch {name}"], times[f"engine layer {name}"]
            overhead = statistics.median(m / e - 1 for m, e in zip(module, engine))
            overheads.append(f"{n_in}->{n_out} {name}: {overhead * 100:+.1f} %")
    print("\nThe bridge's overhead over the engine's layer (median of the rounds' ratios): " + "; ".join(overheads))


if __name__ == "__main__":
    main()
