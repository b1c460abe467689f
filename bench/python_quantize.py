#!/usr/bin/env python3
"""Quantising 16M floats to e4m3 from Python against the C++ bulk call (bench_formats'
BM_QuantizeE4m3, the same 16 Mi floats, scale 0.25), alternating: the binding's overhead is the
argument checks and the new output array. Run with the package installed (scripts/test_python.sh
leaves one in build/venv):

  build/venv/bin/python bench/python_quantize.py --bench build/bench/bench_formats --rounds 5
"""
import argparse
import json
import statistics
import subprocess
import time

import numpy as np

import scalify


def python_ms(x, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        scalify.quantize(x, "e4m3", scale=0.25)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def cpp_ms(bench, threads):
    # The best ISA this CPU has (the last of BM_QuantizeE4m3's ISA arguments), as the package uses.
    out = subprocess.run([bench, f"--benchmark_filter=^BM_QuantizeE4m3/[0-9]/{threads}/", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    run = json.loads(out)["benchmarks"][-1]
    return run["real_time"] if run["time_unit"] == "ms" else run["real_time"] / 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", default="build/bench/bench_formats")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    x = np.random.default_rng(0).standard_normal(16 << 20).astype(np.float32)
    ratios = []
    for r in range(a.rounds):
        py, cpp = python_ms(x, 20), cpp_ms(a.bench, a.threads)
        ratios.append(py / cpp)
        print(f"round {r + 1}: python {py:.2f} ms, C++ {cpp:.2f} ms, ratio {py / cpp:.3f}")
    print(f"median ratio python / C++: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
