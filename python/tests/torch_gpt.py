"""The engine's GPT (src/scalify/nn/gpt.cpp, block.cpp, attention.cpp, mlp.cpp) and the trainer's
step (train/trainer.cpp, optim/grad_norm.cpp, optim/adamw.cpp) written in plain PyTorch, for the
test that trains it next to ``scalify train``.

The model: token embedding plus learned positions, pre-LayerNorm blocks (eps 1e-5) of causal
multi-head attention (packed [q | k | v] projection, scores times 1/sqrt(head width)) and a
tanh-GELU MLP of width 4d, a final LayerNorm and the head tied to the embedding; weights are
[in, out] (y = x W + b), as the engine holds them. A block's four linear layers are
``scalify.torch.Linear`` modules named as the engine names them (``h{l}.attn.qkv``,
``h{l}.attn.proj``, ``h{l}.mlp.fc``, ``h{l}.mlp.out``): the name is the layer's stochastic-rounding
stream. Layers the recipe keeps in high precision (nvfp4's last block) are plain ``x @ W + b``.

The step: mean cross-entropy, backward, the global gradient norm (f64 sum of squares), clipping
by the multiplier grad_clip / norm (rounded to f32) when the norm exceeds grad_clip, and AdamW in
f32 arithmetic with the engine's operation order, decay on wte and the blocks' weight matrices,
the learning rate of train/config.cpp's warmup + cosine schedule."""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
import scalify
import scalify.torch
import torch
import torch.nn.functional as F


class EngineLinear(torch.nn.Module):
    """A block's linear layer with the engine's [in, out] weight: scalify.torch.Linear when the
    recipe quantises it, else torch's f32 ``x @ W + b``."""

    def __init__(self, d_in: int, d_out: int, recipe: scalify.Recipe, name: str, block: int, blocks: int) -> None:
        super().__init__()
        linear = scalify._scalify.linear_recipe_for(recipe, name, block, blocks)
        self.quantized = linear.quantized
        if self.quantized:
            self.layer: Optional[scalify.torch.Linear] = scalify.torch.Linear(d_in, d_out, recipe=linear, name=name,
                                                                               weight_in_out=True)
            self.weight, self.bias = self.layer.weight, self.layer.bias
        else:
            self.layer = None
            self.weight = torch.nn.Parameter(torch.empty(d_in, d_out))
            self.bias = torch.nn.Parameter(torch.empty(d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer is not None:
            return self.layer(x)
        return x @ self.weight + self.bias


class TorchGpt(torch.nn.Module):
    """The engine's GPT; ``params`` maps the engine's parameter names (wte, wpe, h0.ln1.w, ...,
    h0.attn.qkv.w, ..., lnf.b) to this module's Parameters."""

    def __init__(self, recipe: str, *, vocab: int, seq: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        whole = scalify.preset(recipe)
        D = d_model
        self.heads = heads
        self.params: Dict[str, torch.nn.Parameter] = {}

        def param(name: str, *shape: int) -> torch.nn.Parameter:
            p = torch.nn.Parameter(torch.empty(*shape))
            self.params[name] = p
            return p

        self.wte, self.wpe = param("wte", vocab, D), param("wpe", seq, D)
        self.blocks = torch.nn.ModuleList()
        for l in range(layers):
            b = torch.nn.Module()
            b.ln1_w, b.ln1_b = param(f"h{l}.ln1.w", D), param(f"h{l}.ln1.b", D)
            b.ln2_w, b.ln2_b = param(f"h{l}.ln2.w", D), param(f"h{l}.ln2.b", D)
            for attr, short, d_in, d_out in (("qkv", "attn.qkv", D, 3 * D), ("proj", "attn.proj", D, D),
                                             ("fc", "mlp.fc", D, 4 * D), ("out", "mlp.out", 4 * D, D)):
                lin = EngineLinear(d_in, d_out, whole, f"h{l}.{short}", l, layers)
                setattr(b, attr, lin)
                self.params[f"h{l}.{short}.w"], self.params[f"h{l}.{short}.b"] = lin.weight, lin.bias
            self.blocks.append(b)
        self.lnf_w, self.lnf_b = param("lnf.w", D), param("lnf.b", D)

    def load(self, tensors: Dict[str, np.ndarray]) -> None:
        """Parameters from a checkpoint's "param.<name>" arrays (scalify.load_checkpoint)."""
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(torch.from_numpy(np.asarray(tensors["param." + name], dtype=np.float32)))

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        D = self.wte.shape[1]
        H, hd = self.heads, D // self.heads
        x = self.wte[ids] + self.wpe[torch.arange(T)]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for b in self.blocks:
            h = F.layer_norm(x, (D,), b.ln1_w, b.ln1_b, 1e-5)
            q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in b.qkv(h).split(D, dim=2))
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
            att = scores.masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + b.proj((att @ v).transpose(1, 2).reshape(B, T, D))
            h = F.layer_norm(x, (D,), b.ln2_w, b.ln2_b, 1e-5)
            x = x + b.out(F.gelu(b.fc(h), approximate="tanh"))
        logits = F.layer_norm(x, (D,), self.lnf_w, self.lnf_b, 1e-5) @ self.wte.t()
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def learning_rate(step: int, *, lr: float, min_lr: float, warmup: int, steps: int) -> float:
    """train/config.cpp's learning_rate (f64): linear warmup, then cosine to min_lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(steps - warmup, 1))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def decays(name: str) -> bool:
    """nn::Gpt::decays: wte and the blocks' linear weights (the head is tied)."""
    return name == "wte" or (name.endswith(".w") and (".attn." in name or ".mlp." in name))


class EngineAdamW:
    """optim/adamw.cpp's step_plain in f32, operation for operation, after grad_norm.cpp's global
    norm and the trainer's clipping multiplier."""

    def __init__(self, params: Dict[str, torch.nn.Parameter], *, beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8, weight_decay: float = 0.1, grad_clip: float = 1.0) -> None:
        self.params = params
        self.beta1, self.beta2, self.eps, self.wd, self.clip = beta1, beta2, eps, weight_decay, grad_clip
        self.m = {n: torch.zeros_like(p) for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}
        self.t = 0
        self.grad_norms: List[float] = []

    @torch.no_grad()
    def step(self, lr: float) -> None:
        norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in self.params.values()))
        self.grad_norms.append(norm)
        gm = np.float32(self.clip / norm if self.clip > 0 and norm > self.clip else 1.0)
        self.t += 1
        bc1, bc2 = 1 - self.beta1 ** self.t, 1 - self.beta2 ** self.t
        f = np.float32
        b1, b2, c1, c2 = f(self.beta1), f(self.beta2), f(1 - self.beta1), f(1 - self.beta2)
        ibc1, ibc2, eps = f(1 / bc1), f(1 / bc2), f(self.eps)
        for n, p in self.params.items():
            g = p.grad * float(gm)
            m, v = self.m[n], self.v[n]
            m.copy_(float(b1) * m + float(c1) * g)
            v.copy_(float(b2) * v + float(c2) * g * g)
            wd = float(f(self.wd)) if decays(n) else 0.0
            p.copy_(p - float(f(lr)) * ((m * float(ibc1)) / (torch.sqrt(v * float(ibc2)) + float(eps)) + wd * p))
            p.grad = None
