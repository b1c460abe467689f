"""Evaluating a pretrained model: `scalify eval --model` against transformers on the same windows
of the same tokens, with the same number of threads. Each side runs as its own process under
/usr/bin/time (wall seconds, peak RSS), alternating, `--rounds` times (the order reversed every
other round); the table gives the ratios per round and their median, and the two losses (they must
agree: the same model on the same windows). Evaluation alone, without loading: transformers times
its own loop; Scalify's is its time on all windows less its time on one (run beside it), so
tokens/s count the windows after the first.

    python bench/pretrained_eval.py --scalify build/apps/scalify/scalify \
        --model ~/.cache/scalify/SmolLM2-135M-Instruct.Q4_1.gguf --tokens tokens.bin \
        --context 512 --windows 16 --threads 2 --rounds 3       (needs torch, transformers, gguf)

--model is a .gguf file (transformers dequantises it to float32 as Scalify does) or a Hugging Face
folder; --tokens an llm.c token file (`scalify tokenize`). Windows are Scalify's: window i holds
inputs tokens[i*c, i*c + c) and targets shifted by one.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# The transformers side, run in its own process so that its peak RSS is its own.
TRANSFORMERS_EVAL = r"""
import json, os, sys, time
import numpy as np, torch, transformers
model_path, tokens_path, context, windows, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
start = time.perf_counter()
if model_path.endswith(".gguf"):
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(model_path) or ".", gguf_file=os.path.basename(model_path), dtype=torch.float32)
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
model.eval()
raw = np.fromfile(tokens_path, dtype=np.int32, count=256)
tokens = np.fromfile(tokens_path, dtype=np.uint16 if raw[1] == 1 else np.uint32, offset=1024).astype(np.int64)
loaded = time.perf_counter()
total, count = 0.0, 0
with torch.inference_mode():
    for w in range(windows):
        chunk = torch.from_numpy(tokens[w * context: w * context + context + 1])
        logits = model(chunk[None, :-1]).logits[0].double()
        total += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
        count += context
print(json.dumps({"loss": total / count, "load_s": loaded - start, "eval_s": time.perf_counter() - loaded}))
"""


def timed(command, env):
    """Runs `command` under /usr/bin/time: (its stdout, wall seconds, peak RSS in MiB)."""
    with tempfile.NamedTemporaryFile("r") as report:
        out = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", report.name, *command], env=env, check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
        wall, rss_kib = report.read().split()[-2:]
    return out, float(wall), int(rss_kib) / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scalify", required=True, help="the scalify CLI")
    p.add_argument("--model", required=True, help="a .gguf file or a Hugging Face folder")
    p.add_argument("--tokens", required=True, help="an llm.c token file")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    scalify_cmd = [args.scalify, "eval", "--model", args.model, "--data", args.tokens, "--context", str(args.context),
                   "--windows", str(args.windows), "--json"]
    torch_cmd = [sys.executable, "-c", TRANSFORMERS_EVAL, args.model, args.tokens, str(args.context), str(args.windows),
                 str(args.threads)]
    if args.windows < 2:
        p.error("--windows must be at least 2 (evaluation alone is timed as all windows less one)")
    one_window = scalify_cmd[:scalify_cmd.index("--windows") + 1] + ["1", "--json"]
    tokens = args.context * (args.windows - 1)
    print(f"{args.windows} windows of {args.context} tokens, {args.threads} threads\n")
    print("| round | scalify s | transformers s | time ratio | scalify eval tok/s | transformers eval tok/s | "
          "scalify MiB | transformers MiB | memory ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    time_ratios, rate_ratios, memory_ratios = [], [], []
    for r in range(args.rounds):
        runs = {}
        for side in (("scalify", "one", "transformers") if r % 2 == 0 else ("transformers", "one", "scalify")):
            runs[side] = timed({"scalify": scalify_cmd, "one": one_window, "transformers": torch_cmd}[side], env)
        (s_out, s_wall, s_rss), (t_out, t_wall, t_rss) = runs["scalify"], runs["transformers"]
        s_loss, t = json.loads(s_out.strip().splitlines()[-1])["val_loss"], json.loads(t_out)
        t_loss = t["loss"]
        s_rate = tokens / max(s_wall - runs["one"][1], 1e-3)
        t_rate = args.context * args.windows / t["eval_s"]  # its loop timed every window
        time_ratios.append(s_wall / t_wall)
        rate_ratios.append(s_rate / t_rate)
        memory_ratios.append(s_rss / t_rss)
        print(f"| {r + 1} | {s_wall:.1f} | {t_wall:.1f} | {time_ratios[-1]:.2f} | {s_rate:.0f} | {t_rate:.0f} | {s_rss:.0f} | "
              f"{t_rss:.0f} | {memory_ratios[-1]:.2f} |")
    print(f"\nmedian: whole process {statistics.median(time_ratios):.2f}x transformers' time (loading included), "
          f"evaluation {statistics.median(rate_ratios):.2f}x its tokens per second, peak RSS {statistics.median(memory_ratios):.2f}x")
    print(f"loss per token: scalify {s_loss:.8f}, transformers {t_loss:.8f} (relative {abs(s_loss - t_loss) / t_loss:.1e})")


if __name__ == "__main__":
    main()
