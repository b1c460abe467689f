#!/usr/bin/env python3
"""Reference data for Scalify's u-μP, from unit-scaling 0.3.5 (Graphcore's library, PyPI).

Writes, next to this script:
  lr_factors.txt  "<d_model> <layers> <scalify parameter name> <factor>": unit-scaling's
                  AdamW learning-rate factor (lr = 1) of every parameter of a TransformerDecoder
                  with affine RMSNorms, for several widths and depths;
  taus.txt        "<layers> <residual_mult> <residual_attn_ratio> <index> <tau>":
                  transformer_residual_scaling_rule(residual_mult, residual_attn_ratio)(index, 2 layers);
  layer.safetensors  one causal u-μP TransformerLayer at initialisation (f64): its weights in
                  Scalify's layout ([in, out]; the MLP's fc is [linear_gate | linear_1]), the input x,
                  the output gradient g, the output y and the gradients (dx and every weight's) of
                  sum(y * g); the layer's taus, heads and attention mult in the metadata;
  ops.safetensors  single ops (f64) with mults away from 1: "<op>.<tensor>" for silu_glu (mult
                  1.7), linear_readout (w in Scalify's [in, out] layout), cross_entropy (mult 1.3;
                  the loss and the logits' gradient of loss.backward()) and embedding; each op's
                  output y and the gradients of sum(y * g) (the loss itself for cross_entropy).

The one difference from the library's own modules: the norms are made affine
(elementwise_affine=True, gains drawn around 1), as Scalify's norms always have a gain; the
library's TransformerLayer has none. Scalify has no other parameters than these.

Run once (the data is committed):
  pip install --target /tmp/uslib unit-scaling==0.3.5 einops docstring_parser --no-deps
  PYTHONPATH=/tmp/uslib python tests/data/umup/make_reference.py
with torch installed (CPU is enough).
"""

import json
import struct
from pathlib import Path

import torch
import unit_scaling as uu
import unit_scaling._modules as uu_modules
from unit_scaling.core.functional import transformer_residual_scaling_rule

HERE = Path(__file__).resolve().parent

# Affine norms everywhere (Scalify's norms have gains); patched before any module is built.
_RMSNorm = uu_modules.RMSNorm


def affine_rms_norm(normalized_shape, eps=1e-5, elementwise_affine=False):  # noqa: ARG001
    return _RMSNorm(normalized_shape, eps=eps, elementwise_affine=True)


uu_modules.RMSNorm = affine_rms_norm


def scalify_name(name: str) -> list[str]:
    """Scalify's name(s) of a unit-scaling TransformerDecoder parameter."""
    if name == "embedding.weight":
        return ["wte"]
    if name == "final_norm.weight":
        return ["lnf.w"]
    if name == "projection.weight":
        return ["head"]
    parts = name.split(".")  # layers.{i}.{module}...
    i, rest = parts[1], ".".join(parts[2:])
    table = {
        "mhsa_norm.weight": "ln1.w",
        "mhsa.linear_qkv.weight": "attn.qkv.w",
        "mhsa.linear_o.weight": "attn.proj.w",
        "mlp_norm.weight": "ln2.w",
        "mlp.linear_1.weight": "mlp.fc.w",
        "mlp.linear_gate.weight": "mlp.fc.w",
        "mlp.linear_2.weight": "mlp.out.w",
    }
    return [f"h{i}.{table[rest]}"]


def lr_factors() -> list[str]:
    lines = []
    vocab, heads = 40, 2
    for d_model, layers in [(16, 1), (32, 2), (64, 3), (128, 4)]:
        model = uu.TransformerDecoder(hidden_size=d_model, vocab_size=vocab, layers=layers, heads=heads)
        names = {id(p): n for n, p in model.named_parameters()}
        groups = uu.optim.AdamW(model.parameters(), lr=1.0).param_groups
        seen: dict[str, float] = {}
        for g in groups:
            (p,) = g["params"]
            for s in scalify_name(names[id(p)]):
                if s in seen:  # linear_1 and linear_gate share Scalify's fused fc
                    assert seen[s] == g["lr"], s
                    continue
                seen[s] = g["lr"]
                lines.append(f"{d_model} {layers} {s} {g['lr']!r}")
    return lines


def taus() -> list[str]:
    lines = []
    for layers, mult, ratio in [(1, 1.0, 1.0), (2, 1.0, 1.0), (4, 1.0, 1.0), (3, 0.5, 1.0), (3, 2.0, 0.25), (6, 0.7, 1.6)]:
        rule = transformer_residual_scaling_rule(residual_mult=mult, residual_attn_ratio=ratio)
        for index in range(2 * layers):
            lines.append(f"{layers} {mult!r} {ratio!r} {index} {rule(index, 2 * layers)!r}")
    return lines


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    header: dict = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float64).contiguous()
        raw = t.numpy().astype("<f8").tobytes()
        header[name] = {"dtype": "F64", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def layer_reference() -> None:
    torch.manual_seed(47)
    torch.set_default_dtype(torch.float64)
    d, heads, batch, seq = 16, 2, 2, 5
    layers, index, mult, ratio, attn_mult = 3, 1, 0.6, 1.4, 1.5  # the second of three layers
    rule = transformer_residual_scaling_rule(residual_mult=mult, residual_attn_ratio=ratio)
    mhsa_tau, mlp_tau = rule(2 * index, 2 * layers), rule(2 * index + 1, 2 * layers)
    layer = uu.TransformerLayer(hidden_size=d, heads=heads, mhsa_tau=mhsa_tau, mlp_tau=mlp_tau, is_causal=True)
    layer.mhsa.mult = attn_mult  # MHSA's own softmax mult (TransformerLayer leaves it at 1)
    with torch.no_grad():  # gains away from 1, so their gradients are exercised
        for norm in (layer.mhsa_norm, layer.mlp_norm):
            norm.weight.copy_(1 + 0.3 * torch.randn(d))
    x = torch.randn(batch, seq, d, requires_grad=True)
    g = torch.randn(batch, seq, d)
    y = layer(x)
    (y * g).sum().backward()

    weights = {
        "ln1.w": layer.mhsa_norm.weight,
        "attn.qkv.w": layer.mhsa.linear_qkv.weight.T,
        "attn.proj.w": layer.mhsa.linear_o.weight.T,
        "ln2.w": layer.mlp_norm.weight,
        # Scalify's fused fc is [gate | up]: silu(first half) * second half.
        "mlp.fc.w": torch.cat([layer.mlp.linear_gate.weight.T, layer.mlp.linear_1.weight.T], dim=1),
        "mlp.out.w": layer.mlp.linear_2.weight.T,
    }
    grads = {
        "ln1.w": layer.mhsa_norm.weight.grad,
        "attn.qkv.w": layer.mhsa.linear_qkv.weight.grad.T,
        "attn.proj.w": layer.mhsa.linear_o.weight.grad.T,
        "ln2.w": layer.mlp_norm.weight.grad,
        "mlp.fc.w": torch.cat([layer.mlp.linear_gate.weight.grad.T, layer.mlp.linear_1.weight.grad.T], dim=1),
        "mlp.out.w": layer.mlp.linear_2.weight.grad.T,
    }
    tensors = {"x": x, "g": g, "y": y, "grad.x": x.grad}
    tensors.update({"w." + k: v for k, v in weights.items()})
    tensors.update({"grad." + k: v for k, v in grads.items()})
    metadata = {
        "d_model": str(d),
        "heads": str(heads),
        "layers": str(layers),
        "index": str(index),
        "residual_mult": repr(mult),
        "residual_attn_ratio": repr(ratio),
        "attn_mult": repr(attn_mult),
        "mhsa_tau": repr(mhsa_tau),
        "mlp_tau": repr(mlp_tau),
        "norm_eps": "1e-05",
        "source": "unit-scaling 0.3.5 TransformerLayer (affine RMSNorms), tests/data/umup/make_reference.py",
    }
    write_safetensors(HERE / "layer.safetensors", tensors, metadata)


def ops_reference() -> None:
    torch.manual_seed(48)
    torch.set_default_dtype(torch.float64)
    U = uu.functional
    t: dict[str, torch.Tensor] = {}

    def leaf(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(*shape).requires_grad_()

    rows, hidden, d, vocab = 6, 8, 16, 40
    x, gate, g = leaf((rows, hidden)), leaf((rows, hidden)), torch.randn(rows, hidden)
    y = U.silu_glu(x, gate, mult=1.7)
    (y * g).sum().backward()
    t.update({"silu_glu.input": x, "silu_glu.gate": gate, "silu_glu.g": g, "silu_glu.y": y,
              "silu_glu.grad.input": x.grad, "silu_glu.grad.gate": gate.grad})

    x, w, g = leaf((rows, d)), leaf((vocab, d)), torch.randn(rows, vocab)
    y = U.linear_readout(x, w, None)
    (y * g).sum().backward()
    t.update({"readout.x": x, "readout.w": w.T, "readout.g": g, "readout.y": y,
              "readout.grad.x": x.grad, "readout.grad.w": w.grad.T})

    logits, targets = leaf((rows, vocab)), torch.randint(0, vocab, (rows,))
    loss = U.cross_entropy(logits, targets, mult=1.3)
    loss.backward()
    t.update({"cross_entropy.logits": logits, "cross_entropy.targets": targets.to(torch.float64),
              "cross_entropy.y": loss.reshape(1), "cross_entropy.grad.logits": logits.grad})

    ids, w = torch.tensor([[3, 7, 3, 0], [39, 7, 12, 3]]), leaf((vocab, d))
    g = torch.randn(2, 4, d)
    y = U.embedding(ids, w)
    (y * g).sum().backward()
    t.update({"embedding.ids": ids.to(torch.float64), "embedding.w": w, "embedding.g": g, "embedding.y": y,
              "embedding.grad.w": w.grad})
    write_safetensors(HERE / "ops.safetensors", t,
                      {"silu_glu_mult": "1.7", "cross_entropy_mult": "1.3",
                       "source": "unit-scaling 0.3.5 functional, tests/data/umup/make_reference.py"})


def main() -> None:
    (HERE / "lr_factors.txt").write_text("\n".join(lr_factors()) + "\n")
    (HERE / "taus.txt").write_text("\n".join(taus()) + "\n")
    layer_reference()
    ops_reference()


if __name__ == "__main__":
    main()
