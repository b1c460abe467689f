"""The engine's GPT (src/scalify/nn/gpt.cpp, block.cpp, attention.cpp, mlp.cpp) and the trainer's
step (train/trainer.cpp, optim/grad_norm.cpp, optim/adamw.cpp) written in PyTorch, for the test
that trains it next to ``scalify train`` and must match it bit for bit.

The model: token embedding plus learned positions, pre-LayerNorm blocks (eps 1e-5) of causal
multi-head attention (packed [q | k | v] projection, scores times 1/sqrt(head width)) and a
tanh-GELU MLP of width 4d, a final LayerNorm and the head tied to the embedding; weights are
[in, out] (y = x W + b), as the engine holds them. A block's four linear layers are
``scalify.torch.Linear`` modules named as the engine names them (``h{l}.attn.qkv``,
``h{l}.attn.proj``, ``h{l}.mlp.fc``, ``h{l}.mlp.out``): the name is the layer's stochastic-rounding
stream. Layers the recipe keeps in high precision (every layer under f32, nvfp4's last block) are
the engine's ``matmul(x, W) + b``. Every other op is the engine's own (``scalify.torch.functional``):
torch's LayerNorm, softmax attention, GELU, cross-entropy, head GEMM and embedding backward differ
from the engine's kernels by 1-3 ulp. What torch itself does is exact in any order: the residual
adds and the embeddings' sum (one f32 add each), their backward (the gradient passed on), and the
sums torch forms for a tensor used twice (the residual stream: its branch and the skip; the tied
wte: the embedding and the head), each of two terms, which IEEE addition gives alike in either
order.

The step: mean cross-entropy, backward, the global gradient norm (grad_norm.cpp's f64 sum of
squares: parameters in the engine's order, chunks of 8192 elements, eight running sums per
chunk), clipping by the multiplier grad_clip / norm (rounded to f32) when the norm exceeds
grad_clip, and AdamW in f32 arithmetic with the engine's operation order, decay on wte and the
blocks' weight matrices, the learning rate of train/config.cpp's warmup + cosine schedule."""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
import scalify
import scalify.torch
import scalify.torch.functional as SF
import torch


class EngineLinear(torch.nn.Module):
    """A block's linear layer with the engine's [in, out] weight: scalify.torch.Linear when the
    recipe quantises it, else the engine's ``matmul(x, W) + b`` (quant::QLinear unquantised)."""

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
        return SF.add(SF.matmul(x, self.weight), self.bias)


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

            def linear(attr: str, short: str, d_in: int, d_out: int) -> None:
                lin = EngineLinear(d_in, d_out, whole, f"h{l}.{short}", l, layers)
                setattr(b, attr, lin)
                self.params[f"h{l}.{short}.w"], self.params[f"h{l}.{short}.b"] = lin.weight, lin.bias

            # In nn::Gpt::refs()'s order, the order of the gradient norm's sum.
            b.ln1_w, b.ln1_b = param(f"h{l}.ln1.w", D), param(f"h{l}.ln1.b", D)
            linear("qkv", "attn.qkv", D, 3 * D)
            linear("proj", "attn.proj", D, D)
            b.ln2_w, b.ln2_b = param(f"h{l}.ln2.w", D), param(f"h{l}.ln2.b", D)
            linear("fc", "mlp.fc", D, 4 * D)
            linear("out", "mlp.out", 4 * D, D)
            self.blocks.append(b)
        self.lnf_w, self.lnf_b = param("lnf.w", D), param("lnf.b", D)

    def load(self, tensors: Dict[str, np.ndarray]) -> None:
        """Parameters from a checkpoint's "param.<name>" arrays (scalify.load_checkpoint)."""
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(torch.from_numpy(np.asarray(tensors["param." + name], dtype=np.float32)))

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        positions = torch.arange(T).repeat(B, 1)  # one row per batch row, as nn::Gpt::logits
        x = SF.embedding(ids, self.wte) + SF.embedding(positions, self.wpe)
        for b in self.blocks:
            x = x + b.proj(SF.causal_self_attention(b.qkv(SF.layer_norm(x, b.ln1_w, b.ln1_b, eps=1e-5)), self.heads))
            x = x + b.out(SF.gelu(b.fc(SF.layer_norm(x, b.ln2_w, b.ln2_b, eps=1e-5))))
        logits = SF.matmul(SF.layer_norm(x, self.lnf_w, self.lnf_b, eps=1e-5), self.wte.t())  # the engine's transpose of wte
        return SF.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def learning_rate(step: int, *, lr: float, min_lr: float, warmup: int, steps: int) -> float:
    """train/config.cpp's learning_rate (f64): linear warmup, then cosine to min_lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(steps - warmup, 1))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def decays(name: str) -> bool:
    """nn::Gpt::decays: wte and the blocks' linear weights (the head is tied)."""
    return name == "wte" or (name.endswith(".w") and (".attn." in name or ".mlp." in name))


def gradient_sum_squares(grads: List[torch.Tensor]) -> float:
    """optim/grad_norm.cpp's f64 sum of squares: each tensor cut into chunks of 8192 elements, each
    chunk summed into eight running sums (element i into sum i mod 8; a chunk's tail of n mod 8
    into the first ones) added as ((0+1)+(2+3))+((4+5)+(6+7)), the chunks' sums added in order."""
    total = 0.0
    for g in grads:
        flat = g.detach().reshape(-1).double().numpy()
        for begin in range(0, flat.size, 8192):
            chunk = flat[begin:begin + 8192] ** 2  # exact: a float32's square fits a double
            whole = chunk.size // 8 * 8
            lanes = np.zeros(8) if whole == 0 else np.cumsum(chunk[:whole].reshape(-1, 8), axis=0)[-1]  # in order
            lanes[:chunk.size - whole] += chunk[whole:]
            total += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    return total


class EngineAdamW:
    """optim/adamw.cpp's step_plain in f32, operation for operation, after grad_norm.cpp's global
    norm and the trainer's clipping multiplier. In NumPy: its f32 sqrt is correctly rounded, as
    the engine's std::sqrt; torch's float32 sqrt (torch 2.x, AVX-512 here) is not always (measured:
    18% of values in [0, 0.02) 1 ulp off the correctly rounded root, which moved 1-16% of each
    tensor's weights by 1 ulp at the first step)."""

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
        norm = math.sqrt(gradient_sum_squares([p.grad for p in self.params.values()]))
        self.grad_norms.append(norm)
        f = np.float32
        gm = f(self.clip / norm if self.clip > 0 and norm > self.clip else 1.0)
        self.t += 1
        bc1, bc2 = 1 - self.beta1 ** self.t, 1 - self.beta2 ** self.t
        b1, b2, c1, c2 = f(self.beta1), f(self.beta2), f(1 - self.beta1), f(1 - self.beta2)
        ibc1, ibc2, eps, lr32 = f(1 / bc1), f(1 / bc2), f(self.eps), f(lr)
        for n, p in self.params.items():
            w, m, v = p.detach().numpy(), self.m[n].numpy(), self.v[n].numpy()  # views: updated in place
            g = p.grad.numpy() * gm
            m[...] = b1 * m + c1 * g
            v[...] = b2 * v + c2 * g * g
            wd = f(self.wd) if decays(n) else f(0)
            w[...] = w - lr32 * ((m * ibc1) / (np.sqrt(v * ibc2) + eps) + wd * w)
            p.grad = None
