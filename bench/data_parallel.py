#!/usr/bin/env python3
"""Data parallelism on one machine (issue 33): 2 ranks x 1 thread (mpirun -np 2) against
1 rank x 2 threads, the same global batch (accum=2: one micro-batch per rank, two in turn on one
process), alternating pair by pair at the step-speed sizes; then the gradient exchange's bytes per
step and its share of the step for each wire format. Prints `scalify info` first.

  bench/data_parallel.py                         # small, medium, gpt2; 2 rounds
  bench/data_parallel.py --sizes small --rounds 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# name: (d_model, layers, heads, seq, batch, steps): bench/peers/step_ratio.py's sizes
SIZES = {
    "small": (128, 4, 4, 128, 16, 12),
    "medium": (384, 6, 6, 256, 8, 8),
    "gpt2": (768, 12, 12, 256, 4, 5),
}
WARMUP = 2


def train(cli, size, recipe, ranks, threads):
    d, layers, heads, seq, batch, steps = SIZES[size]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [cli, "train", "--out", os.path.join(tmp, "run"), "--steps", str(steps + WARMUP), "--recipe", recipe,
               "--set", f"d_model={d}", "--set", f"layers={layers}", "--set", f"heads={heads}", "--set", f"seq={seq}",
               "--set", f"batch={batch}", "--set", "accum=2", "--set", "eval_every=100000000",
               "--set", "checkpoint_every=100000000", "--set", "stats_every=100000000", "--set", "eval_windows=1"]
        if ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + cmd
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"data_parallel: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
        rows = [json.loads(l) for l in open(os.path.join(tmp, "run", "metrics.jsonl"))]
    rows = [r for r in rows if "tokens_per_s" in r][WARMUP:]
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    step_s = 2 * batch * seq / tps
    comm_s = statistics.median(r.get("allreduce_s", 0.0) for r in rows)
    return tps, comm_s / step_s, rows[0].get("allreduce_bytes", 0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scalify", default=os.path.join(HERE, "..", "build", "apps", "scalify", "scalify"))
    p.add_argument("--sizes", default="small,medium,gpt2")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    print(subprocess.run([a.scalify, "info"], capture_output=True, text=True).stdout)
    print("| size | 1 rank x 2 threads (tok/s) | 2 ranks x 1 thread (tok/s) | ratio (2 ranks / 1) per round | exchange share |")
    print("|---|---|---|---|---|")
    for size in a.sizes.split(","):
        one, two, ratios, shares = [], [], [], []
        for _ in range(a.rounds):  # alternating: a busy spell hits both sides of a pair
            t1, _, _ = train(a.scalify, size, "f32", 1, 2)
            t2, share, _ = train(a.scalify, size, "f32", 2, 1)
            one.append(t1), two.append(t2), ratios.append(t2 / t1), shares.append(share)
        print(f"| {size} (d={SIZES[size][0]} L={SIZES[size][1]}) | {statistics.median(one):.0f} | {statistics.median(two):.0f} | "
              f"{' '.join(f'{r:.2f}' for r in ratios)} | {100 * statistics.median(shares):.1f}% |", flush=True)
    print("\n| size | wire | bytes sent per rank per step | exchange share of the step | tok/s |")
    print("|---|---|---|---|---|")
    for size in a.sizes.split(","):
        for recipe, wire in [("f32", "f32 (in storage)"), ("f32_allreduce_f16", "f16"), ("f32_allreduce_e4m3", "e4m3")]:
            tps, share, sent = train(a.scalify, size, recipe, 2, 1)
            print(f"| {size} | {wire} | {sent / 1e6:.2f} MB | {100 * share:.1f}% | {tps:.0f} |", flush=True)


if __name__ == "__main__":
    main()
