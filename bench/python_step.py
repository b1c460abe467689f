#!/usr/bin/env python3
"""A Python-driven training step against the CLI's on the same model (d=128, 4 layers, T=128,
B=16, f32, 30 steps, the first 3 dropped), alternating runs; the ratio of median step times.

  build/venv/bin/python bench/python_step.py --scalify build/apps/scalify/scalify --data FILE --rounds 3
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

import scalify

KEYS = dict(d_model=128, layers=4, heads=4, seq=128, batch=16, eval_every=100000, checkpoint_every=100000, stats_every=100000,
            eval_windows=1)


def median_tokens_per_s(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        t = [json.loads(line)["tokens_per_s"] for line in f if "tokens_per_s" in line][3:]
    return statistics.median(t)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scalify", default="build/apps/scalify/scalify")
    p.add_argument("--data", default="")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    data = {"data": a.data} if a.data else {}
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            py_dir, cli_dir = os.path.join(tmp, f"py{r}"), os.path.join(tmp, f"cli{r}")
            scalify.train(py_dir, recipe="f32", steps=30, **data, **KEYS)
            sets = [x for k, v in {**data, **KEYS}.items() for x in ("--set", f"{k}={v}")]
            subprocess.run([a.scalify, "train", "--recipe", "f32", "--steps", "30", "--out", cli_dir, *sets], check=True, capture_output=True)
            py, cli = median_tokens_per_s(py_dir), median_tokens_per_s(cli_dir)
            ratios.append(cli / py)
            print(f"round {r + 1}: python {py:.0f} tok/s, CLI {cli:.0f} tok/s, python step / CLI step {cli / py:.3f}")
    print(f"median python step / CLI step: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
