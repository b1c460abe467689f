"""transformers' loss on a folder `scalify export` wrote, for comparison with `scalify eval --model`
(run by hand, in the venv of make_reference.py; docs/RESULTS.md records a run):

    scalify export runs/a --out runs/a/hf
    scalify eval --model runs/a/hf --data TEXT --json
    /tmp/hfvenv/bin/python tests/data/hf/check_export.py runs/a/hf TEXT [CONTEXT]

Tokenises TEXT with the folder's tokenizer and prints the mean next-token loss over the same
consecutive non-overlapping windows of CONTEXT + 1 tokens (default: the model's longest).
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    folder, text = sys.argv[1], sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(folder).encode(open(text, encoding="utf-8").read())
    T = int(sys.argv[3]) if len(sys.argv) > 3 else model.config.max_position_embeddings if hasattr(
        model.config, "max_position_embeddings") else model.config.n_positions
    windows = (len(ids) - 1) // T
    total = 0.0
    with torch.no_grad():
        for w0 in range(0, windows, 64):
            ws = range(w0, min(windows, w0 + 64))
            x = torch.tensor([ids[w * T:w * T + T] for w in ws])
            y = torch.tensor([ids[w * T + 1:w * T + T + 1] for w in ws])
            logits = model(x).logits
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
    print(f"transformers: {total / (windows * T):.10f} nats per token over {windows} windows of {T}")


if __name__ == "__main__":
    main()
