"""Engine vs PyTorch training-step speed and memory, alternating runs on the same machine.

For each model size, `--rounds` times: one `scalify train` run per recipe, then one PyTorch eager
f32 run of the same model and batch (torch_gpt.py). Each run is a separate process; its first
`--warmup` steps are dropped, the rest pooled. Prints Markdown tables: per size the engine's f32
step against PyTorch's (median ms, ratio, peak resident memory), and per size every recipe's step
against the engine's f32 step. Run through step_vs_pytorch.sh, which sets up PyTorch."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# name: (d_model, layers, heads, seq, batch, steps)
SIZES = {
    "small": (128, 4, 4, 128, 16, 12),
    "medium": (384, 6, 6, 256, 8, 8),
    "gpt2": (768, 12, 12, 256, 4, 5),
}


def run(cmd, env):
    """Runs cmd; returns (stdout, peak resident MB of the child)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"step_ratio: {' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return out


def engine_step(scalify, size, recipe, env, warmup, shape=None):
    d, layers, heads, seq, batch, steps = SIZES[size]
    if shape:  # (seq, batch) override: the scaling sweep; smaller steps run more of them
        steps = max(steps, steps * seq * batch // (shape[0] * shape[1]))
        seq, batch = shape
    with tempfile.TemporaryDirectory() as tmp:
        out = run([scalify, "train", "--out", os.path.join(tmp, "run"), "--steps", str(steps + warmup), "--recipe", recipe,
                   "--set", f"d_model={d}", "--set", f"layers={layers}", "--set", f"heads={heads}", "--set", f"seq={seq}",
                   "--set", f"batch={batch}", "--set", "eval_every=100000000", "--set", "checkpoint_every=100000000",
                   "--set", "stats_every=100000000", "--set", "eval_windows=1"], env)
        rows = [json.loads(line) for line in open(os.path.join(tmp, "run", "metrics.jsonl"))]
    ms = [batch * seq / r["tokens_per_s"] * 1e3 for r in rows if "tokens_per_s" in r][warmup:]
    peak = float(re.search(r"peak memory: ([0-9.]+) MB", out).group(1))
    state = float(re.search(r"training state: ([0-9.]+) bytes per parameter", out).group(1))
    return ms, peak, state


def torch_step(python, size, env, warmup, threads):
    d, layers, heads, seq, batch, steps = SIZES[size]
    out = run([python, os.path.join(HERE, "torch_gpt.py"), "--d_model", str(d), "--layers", str(layers), "--heads", str(heads),
               "--seq", str(seq), "--batch", str(batch), "--steps", str(steps + warmup), "--threads", str(threads)], env)
    r = json.loads(out.strip().splitlines()[-1])
    return r["ms"][warmup:], r["peak_rss_mb"], r["params"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scalify", default="build/apps/scalify/scalify")
    p.add_argument("--python", default=sys.executable, help="a Python with torch")
    p.add_argument("--sizes", default="small,medium,gpt2", help=f"comma-separated, of {','.join(SIZES)}")
    p.add_argument("--recipes", default="f32", help="engine recipes, comma-separated; f32 first is the baseline")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-torch", action="store_true", help="engine recipes only")
    p.add_argument("--scaling", action="store_true",
                   help="instead: the engine's f32 tokens/s on the small model across tokens per step "
                        "(T = 128, B = 4..64: 512..8192 tokens) and across T at 8192 tokens per step")
    a = p.parse_args()
    if a.scaling:
        return scaling(a)
    recipes = a.recipes.split(",")
    if recipes[0] != "f32":
        recipes.insert(0, "f32")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    for size in a.sizes.split(","):
        if size not in SIZES:
            sys.exit(f"step_ratio: unknown size '{size}' (one of {', '.join(SIZES)})")
    results = {}
    for size in a.sizes.split(","):
        eng = {r: ([], 0.0, 0.0) for r in recipes}
        torch_ms, torch_peak, params = [], 0.0, 0
        for k in range(a.rounds):
            for r in recipes:
                t0 = time.time()
                ms, peak, state = engine_step(a.scalify, size, r, env, a.warmup)
                eng[r] = (eng[r][0] + ms, max(eng[r][1], peak), state)
                print(f"[{size} round {k + 1}/{a.rounds}] engine {r}: {statistics.median(ms):.1f} ms "
                      f"({time.time() - t0:.0f} s)", file=sys.stderr)
            if not a.no_torch:
                ms, peak, params = torch_step(a.python, size, env, a.warmup, a.threads)
                torch_ms += ms
                torch_peak = max(torch_peak, peak)
                print(f"[{size} round {k + 1}/{a.rounds}] pytorch: {statistics.median(ms):.1f} ms", file=sys.stderr)
        results[size] = (eng, torch_ms, torch_peak, params)

    d_of = lambda s: "d=%d L=%d H=%d T=%d B=%d" % SIZES[s][:5]
    if not a.no_torch:
        print("\n| model | parameters | tokens/step | engine f32 ms | PyTorch ms | engine / PyTorch | engine peak MB | PyTorch peak MB | memory ratio |")
        print("|---|---|---|---|---|---|---|---|---|")
        for size, (eng, tms, tpeak, params) in results.items():
            ems, epeak, _ = eng["f32"]
            e, t = statistics.median(ems), statistics.median(tms)
            print(f"| {size} ({d_of(size)}) | {params / 1e6:.2f}M | {SIZES[size][3] * SIZES[size][4]} | {e:.1f} | {t:.1f} | "
                  f"**{e / t:.2f}** | {epeak:.0f} | {tpeak:.0f} | {epeak / tpeak:.2f} |")
    print("\n| model | recipe | step ms | vs engine f32 | training state bytes/param | peak MB |")
    print("|---|---|---|---|---|---|")
    for size, (eng, _, _, _) in results.items():
        base = statistics.median(eng["f32"][0])
        for r, (ms, peak, state) in eng.items():
            m = statistics.median(ms)
            print(f"| {size} | {r} | {m:.1f} | {m / base:.2f} | {state:.2f} | {peak:.0f} |")


def scaling(a):
    """tokens/s of the small f32 model across batch shapes, alternating rounds. The host's load
    drifts from minute to minute, so each shape is also compared with the 2048-token run of its
    own round (the per-round ratios' median and range)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    d, layers = SIZES["small"][0], SIZES["small"][1]
    base_shape = (128, 16)
    shapes = [(128, 4), (128, 8), base_shape, (128, 32), (128, 64), (64, 128), (256, 32), (512, 16), (1024, 8)]
    ms = {s: [] for s in shapes}
    per_round = {s: [] for s in shapes}  # that round's median step ms
    for k in range(a.rounds):
        for shape in shapes:
            m, _, _ = engine_step(a.scalify, "small", "f32", env, a.warmup, shape)
            ms[shape] += m
            per_round[shape].append(statistics.median(m))
            print(f"[scaling round {k + 1}/{a.rounds}] T={shape[0]} B={shape[1]}: {statistics.median(m):.1f} ms", file=sys.stderr)
    tps = lambda shape, step_ms: shape[0] * shape[1] / (step_ms / 1e3)
    base = tps(base_shape, statistics.median(ms[base_shape]))
    print("\n| T | B | tokens/step | step ms | tokens/s | vs T=128 B=16, pooled | per round: median (range) | attention share of FLOPs |")
    print("|---|---|---|---|---|---|---|---|")
    for (t, b) in shapes:
        step = statistics.median(ms[(t, b)])
        ratios = [tps((t, b), x) / tps(base_shape, y) for x, y in zip(per_round[(t, b)], per_round[base_shape])]
        # per token: 6 * params for the linear layers, 6 * layers * T * d for the causal scores and mix (half of T x T)
        linear = 6 * (12 * d * d * layers + 256 * d)
        attn = 6 * layers * t * d
        print(f"| {t} | {b} | {t * b} | {step:.1f} | {tps((t, b), step):.0f} | {tps((t, b), step) / base:.2f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {attn / (attn + linear):.0%} |")


if __name__ == "__main__":
    main()
