"""PyTorch reference for the trainer's step: the same GPT as nn::Gpt (learned positions, pre-LN
blocks, causal attention, tanh-GELU MLP of width 4d, final LayerNorm, head tied to the embedding,
byte vocabulary) and the same step (mean cross-entropy, backward, global-norm clipping at 1.0,
AdamW with decay on matrices only). Eager mode, f32. Prints one JSON line:
{"ms": [per-step wall times], "peak_rss_mb": ..., "params": ...}.

Benchmark dependency only (bench/peers/step_vs_pytorch.sh installs torch into its own venv)."""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, attention):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        if attention == "sdpa":  # PyTorch's fused kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # the textbook composition, as the engine's ops are written
            att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D // self.heads))
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, seq, d, layers, heads):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)

    def forward(self, ids, attention):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for b in self.blocks:
            x = b(x, attention)
        return self.lnf(x) @ self.wte.weight.t()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--d_model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--attention", choices=["sdpa", "plain"], default="sdpa")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = Gpt(256, a.seq, a.d_model, a.layers, a.heads)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wpe" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95), eps=1e-8)
    ms = []
    for _ in range(a.steps):
        ids = torch.randint(0, 256, (a.batch, a.seq + 1))
        t0 = time.perf_counter()
        logits = model(ids[:, :-1], a.attention)
        loss = F.cross_entropy(logits.reshape(-1, 256), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ms.append((time.perf_counter() - t0) * 1e3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"ms": ms, "peak_rss_mb": peak, "params": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main()
