"""Training steps on shared cores (issue 42): the engine's f32 step and PyTorch's eager step on the
same model (step_ratio.py's small GPT: d=128, 4 layers, T=128, B=16), alone and beside 1, 2 and
4 busy processes (a busy loop each). Every round runs each load in turn, and within a load the
engine and PyTorch alternate, so a drift of the host's other work falls on all of them alike.
Each column's slowdown is its quiet tokens/s over its loaded tokens/s in the same round (median
and range over the rounds); 'fair share' is the slowdown if the cores were shared evenly among
the runnable threads: (threads + busy) / cores, once that exceeds 1.

The engine runs twice: with scalify's OpenMP wait (platform/openmp_wait.hpp), and with libgomp's
default spin count set by hand (GOMP_SPINCOUNT=300000), as every run was before issue 42.
Run through step_under_load.sh, which sets up PyTorch."""
import argparse
import os
import statistics
import subprocess
import sys
import time

from step_ratio import SIZES, engine_step, torch_step

# column: (what runs, extra environment)
COLUMNS = {
    "engine": ("engine", {}),
    "engine with libgomp's spin": ("engine", {"GOMP_SPINCOUNT": "300000"}),
    "PyTorch": ("torch", {}),
}


def tokens_per_s(ms):
    d, layers, heads, seq, batch, steps = SIZES["small"]
    return seq * batch / (statistics.median(ms) / 1e3)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scalify", default="build/apps/scalify/scalify")
    p.add_argument("--python", default=sys.executable, help="a Python with torch")
    p.add_argument("--busy", default="0,1,2,4", help="busy processes beside the step, comma-separated; 0 first")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--columns", default=",".join(COLUMNS), help=f"comma-separated, of {', '.join(COLUMNS)}")
    a = p.parse_args()
    loads = [int(n) for n in a.busy.split(",")]
    if loads[0] != 0:
        loads.insert(0, 0)
    columns = a.columns.split(",")
    for c in columns:
        if c not in COLUMNS:
            sys.exit(f"step_under_load: unknown column '{c}' (one of {', '.join(COLUMNS)})")
    # The user's own OpenMP wait would decide every column alike: measure the defaults.
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    base["OMP_NUM_THREADS"] = str(a.threads)
    tps = {(c, n): [] for c in columns for n in loads}  # one tokens/s per round
    for k in range(a.rounds):
        for n in loads:
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
            try:
                for c in columns:
                    kind, extra = COLUMNS[c]
                    env = dict(base, **extra)
                    t0 = time.time()
                    if kind == "engine":
                        ms = engine_step(a.scalify, "small", "f32", env, a.warmup)[0]
                    else:
                        ms = torch_step(a.python, "small", env, a.warmup, a.threads)[0]
                    tps[(c, n)].append(tokens_per_s(ms))
                    print(f"[round {k + 1}/{a.rounds}, {n} busy] {c}: {tps[(c, n)][-1]:.0f} tokens/s ({time.time() - t0:.0f} s, "
                          f"load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
            finally:
                for b in busy:
                    b.kill()
                    b.wait()

    cores = os.cpu_count()
    head = "| busy processes | fair share |" + "".join(f" {c} tokens/s | {c} slowdown |" for c in columns)
    print(f"\n{a.threads} threads, {cores} cores, {a.rounds} rounds; slowdown: median (range) of the rounds' quiet / loaded\n")
    print(head)
    print("|---|---|" + "---|---|" * len(columns))
    for n in loads:
        row = f"| {n} | {max(1.0, (a.threads + n) / cores):.1f} |"
        for c in columns:
            ratios = [q / x for q, x in zip(tps[(c, 0)], tps[(c, n)])]
            row += f" {statistics.median(tps[(c, n)]):.0f} | {statistics.median(ratios):.1f} ({min(ratios):.1f}–{max(ratios):.1f}) |"
        print(row)


if __name__ == "__main__":
    main()
