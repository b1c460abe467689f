"""Scalify's recipes in your own PyTorch model: a small causal language model written in plain
PyTorch, its linear layers converted to scalify.torch.Linear under a recipe, trained with
torch.optim.AdamW on the trainer's own batches (bytes of Debian's fortunes) beside the same model
left in f32, then the per-operand statistics of the last step.
Run: python examples/python/torch_convert.py [recipe]   (needs torch; default recipe mxfp8)"""

import sys

import scalify  # before torch: OpenMP's threads then wait briefly in both libraries (scalify.torch warns otherwise)
import scalify.torch
import torch


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return out


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 256, seq: int = 64, d: int = 64, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf = torch.nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.lnf(x) @ self.wte.weight.t()
        return logits


def train(model: torch.nn.Module, steps: int = 60) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loss = torch.zeros(())
    for step in range(steps):
        ids, targets = (torch.from_numpy(a) for a in scalify.training_batch(step, batch=16, seq=64))
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return loss.item()


def main() -> None:
    recipe = sys.argv[1] if len(sys.argv) > 1 else "mxfp8"
    torch.manual_seed(0)
    reference = TinyLM()
    converted = scalify.torch.convert(TinyLM(), recipe)
    converted.load_state_dict(reference.state_dict())  # the same initial weights
    print(f"f32:      final loss {train(reference):.4f}")
    print(f"{recipe:9s} final loss {train(converted):.4f}")
    stats = scalify.torch.statistics(converted)
    rows = stats.to_dict("records") if hasattr(stats, "to_dict") else stats
    for r in rows[:6]:
        print(f"{r['layer']:16s} {r['operand']:12s} {r['format']:5s} amax {r['amax']:.3g}  underflow {r['underflow']:.2%}")


if __name__ == "__main__":
    main()
