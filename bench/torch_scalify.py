"""A SCALIFY training step of a tiny transformers GPT-2 from Python (scalify.torch.scalify, every
aten op dispatched to the engine's scaled op) against the same model's plain float32 torch step, in
one process, alternating: `--rounds` rounds of both in turn (the order reversed every other round),
each timed over `--iters` steps after one warm-up step; the ratio per round, then its median. Also
the number of aten ops one step dispatches (forward, backward, AdamW) and the dispatch overhead per
op: (scaled step - f32 step) / ops.

    python bench/torch_scalify.py --threads 2 --d-model 256 --rounds 5   (needs torch, transformers)
"""
import argparse
import copy
import statistics
import time

import scalify  # before torch: both libraries' OpenMP threads then wait briefly
import scalify.torch as st
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--recipe", default="scalify_fp16_1")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: as set)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=a.seq, n_embd=a.d_model, n_layer=a.layers, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    plain = transformers.GPT2LMHeadModel(config)
    scaled = st.scalify(copy.deepcopy(plain), a.recipe)
    ids = torch.from_numpy(scalify.training_batch(0, batch=a.batch, seq=a.seq)[0])
    runs = {}
    for name, model in (("f32", plain), (a.recipe, scaled)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, opt=opt):
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()

        runs[name] = step
    runs[a.recipe]()  # warm-up, and the optimizer's state exists before counting
    with Count() as count:
        runs[a.recipe]()
    times = {name: [] for name in runs}
    for r in range(a.rounds):
        for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            runs[name]()
            start = time.perf_counter()
            for _ in range(a.iters):
                runs[name]()
            times[name].append((time.perf_counter() - start) / a.iters)
    f32, sc = statistics.median(times["f32"]), statistics.median(times[a.recipe])
    ratio = statistics.median(s / f for s, f in zip(times[a.recipe], times["f32"]))
    print(f"| d_model {a.d_model}, {a.layers} layers, batch {a.batch} x {a.seq} | f32 step {f32 * 1e3:.1f} ms | "
          f"{a.recipe} step {sc * 1e3:.1f} ms | {ratio:.2f}x | {count.ops} aten ops | "
          f"{(sc - f32) / count.ops * 1e6:.0f} us per op |")
    print("ops without a rule:", st.unhandled_ops() or "none")


if __name__ == "__main__":
    main()
