#!/usr/bin/env python3
"""An independent re-implementation of seed 003's FP8 post-training quantisation in PyTorch.

Seed 003 ("Training and inference of large language models using 8-bit floating point", §2.3,
§3.1, Appendix E/G) quantises the four linear layers of every decoder layer (attn qkv, attn out,
ff intermediate, ff output); embeddings, norms, the dot-product attention and the LM head stay in
high precision. Weights and input activations are multiplied by 2^b and cast to FP8 E4
(round to nearest even, saturating), with b = floor(log2(F / amax)) per tensor (FP8-AMAX; F = 448
for e4m3) or one constant b for everything (FP8-CSCALE). Weights get their bias once; activations
get theirs from the tensor being cast, and the paper counts one activation bias per *data sample*
(Appendix G: "varies depending on the data sample"; Figure 6 shows its mode over the samples).

This script runs that definition with transformers' LlamaForCausalLM and torch's float8 casts,
on non-overlapping windows of `context` + 1 tokens (as `scalify eval --model` takes them), with
the activation amax taken either per window (the paper) or over a whole batch of windows. Used
to establish which one `scalify quantize --model` computes (docs/RESULTS.md, issue 46), and once
to write the expected values of python/tests/test_ptq_reference.py; no test runs it.

    python tests/data/ptq/reference_ptq.py --model smollm2-hf --tokenize corpus.txt --tokens tokens.bin
    python tests/data/ptq/reference_ptq.py --model smollm2-hf --tokens tokens.bin \
        --context 64 --windows 64 --batch 16 --method amax --amax window
    python tests/data/ptq/reference_ptq.py --model tests/data/hf/tiny_llama \
        --make-test-reference tests/data/ptq/quiet_tokens_reference.json
"""
from __future__ import annotations

import argparse
import math

import numpy as np
import torch
from transformers import LlamaForCausalLM

E4M3_MAX = 448.0
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def read_tokens(path: str) -> np.ndarray:
    """llm.c token file: 256 int32 header (magic 20240520, version 1, count), then uint16 tokens."""
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype=np.int32)
    assert header[0] == 20240520 and header[1] == 1, "expects an llm.c version-1 token file"
    return np.frombuffer(raw[1024:], dtype=np.uint16)[: header[2]].astype(np.int64)


def write_tokens(model_dir: str, text_file: str, out: str) -> None:
    """TEXT_FILE's text through the model's tokenizer (transformers), as an llm.c token file."""
    from transformers import AutoTokenizer

    with open(text_file, encoding="utf-8", errors="replace") as f:
        ids = AutoTokenizer.from_pretrained(model_dir)(f.read())["input_ids"]
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(ids)]
    with open(out, "wb") as f:
        f.write(header.tobytes() + np.asarray(ids, dtype="<u2").tobytes())
    print(f"{len(ids)} tokens")


def amax_bias(amax: torch.Tensor) -> torch.Tensor:
    """b = floor(log2(F / amax)) (seed 003 eq. 3), in double as a reader would do by hand."""
    return torch.floor(torch.log2(E4M3_MAX / amax.double())).to(torch.float32)


def cast_e4m3(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x * 2^b cast to e4m3 (nearest even, saturating at 448) and decoded: x's represented value."""
    scale = torch.exp2(bias)
    y = (x * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return y / scale


def quantise_weights(model: LlamaForCausalLM, method: str, bias: int) -> None:
    """One bias per weight tensor as Scalify stores the model: q|k|v and gate|up are one tensor each."""
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        for group in ((a.q_proj, a.k_proj, a.v_proj), (a.o_proj,), (m.gate_proj, m.up_proj), (m.down_proj,)):
            if method == "amax":
                b = amax_bias(max(lin.weight.detach().abs().max() for lin in group))
            else:
                b = torch.tensor(float(bias))
            for lin in group:
                lin.weight.data = cast_e4m3(lin.weight.data, b)


def quantise_activations(model: LlamaForCausalLM, method: str, bias: int, per: str) -> None:
    """A pre-hook on every quantised linear: its input x [B, T, K] cast with its own bias."""

    def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x = args[0]
        if method == "cscale":
            b = torch.tensor(float(bias))
        elif per == "window":  # one amax per data sample
            b = amax_bias(x.abs().amax(dim=tuple(range(1, x.dim())), keepdim=True))
        else:  # one amax over the whole batch of windows
            b = amax_bias(x.abs().max())
        return (cast_e4m3(x, b),) + args[1:]

    for layer in model.model.layers:
        for name, module in list(layer.self_attn.named_children()) + list(layer.mlp.named_children()):
            if name in LINEARS:
                module.register_forward_pre_hook(hook)


@torch.no_grad()
def window_losses(model: LlamaForCausalLM, tokens: np.ndarray, context: int, windows: int, batch: int) -> list[float]:
    """Mean cross-entropy of each window (inputs tokens[i c, i c + c), targets shifted by one)."""
    out: list[float] = []
    for w0 in range(0, windows, batch):
        ids = [tokens[i * context : i * context + context + 1] for i in range(w0, min(w0 + batch, windows))]
        t = torch.tensor(np.stack(ids))
        logits = model(input_ids=t[:, :-1]).logits
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), t[:, 1:], reduction="none")
        out += ce.mean(dim=1).tolist()
    return out


# The test's model: the tiny Llama with the embeddings of QUIET_TOKENS multiplied by 2^-26, so a
# window of them has activations some 2^-16 of an ordinary window's (RMSNorm's eps keeps them
# small). Quantised with the amax of a batch that also holds an ordinary window, they fall below
# e4m3's smallest subnormal and flush to zero; with their own window's amax they keep 3 bits.
QUIET_TOKENS = range(500, 509)
QUIET_SCALE = 2.0**-26
TEST_CONTEXT = 8
TEST_TOKENS = [11, 222, 33, 444, 55, 666, 77, 888] + list(QUIET_TOKENS)  # window 0 ordinary, window 1 quiet


def make_test_reference(model_dir: str, out: str) -> None:
    """The expected values of python/tests/test_ptq_reference.py: FP8-AMAX on the quiet-token
    model, two windows in one batch, with each activation's bias per window (the paper) and per
    batch; the loss of each window."""
    import json

    def fresh() -> LlamaForCausalLM:
        m = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            m.model.embed_tokens.weight[list(QUIET_TOKENS)] *= QUIET_SCALE
        return m

    t = np.asarray(TEST_TOKENS, dtype=np.int64)
    ref: dict[str, object] = {"context": TEST_CONTEXT, "tokens": TEST_TOKENS, "quiet_tokens": list(QUIET_TOKENS),
                              "quiet_scale": QUIET_SCALE}
    ref["f32"] = window_losses(fresh(), t, TEST_CONTEXT, 2, 2)
    for per in ("window", "batch"):
        model = fresh()
        quantise_weights(model, "amax", 0)
        quantise_activations(model, "amax", 0, per)
        ref[f"amax_per_{per}"] = window_losses(model, t, TEST_CONTEXT, 2, 2)
    with open(out, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(json.dumps(ref))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a Hugging Face Llama folder")
    p.add_argument("--tokens", help="llm.c token file")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--batch", type=int, default=1, help="windows per forward pass")
    p.add_argument("--method", choices=["f32", "amax", "cscale"], default="amax")
    p.add_argument("--bias", type=int, default=0, help="cscale: the constant bias")
    p.add_argument("--amax", choices=["window", "batch"], default="window", help="activations: amax per window or per batch")
    p.add_argument("--weights-only", action="store_true")
    p.add_argument("--tokenize", metavar="TEXT", help="write TEXT through the model's tokenizer to --tokens (llm.c) and stop")
    p.add_argument("--make-test-reference", metavar="JSON", help="write the test's expected values (tiny model) and stop")
    a = p.parse_args()
    torch.set_num_threads(2)
    if a.tokenize:
        write_tokens(a.model, a.tokenize, a.tokens)
        return
    if a.make_test_reference:
        make_test_reference(a.model, a.make_test_reference)
        return
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").eval()
    if a.method != "f32":
        quantise_weights(model, a.method, a.bias)
        if not a.weights_only:
            quantise_activations(model, a.method, a.bias, a.amax)
    losses = window_losses(model, read_tokens(a.tokens), a.context, a.windows, a.batch)
    loss = sum(losses) / len(losses)
    print(f"{a.method} amax={a.amax} batch={a.batch}: loss {loss:.6f} perplexity {math.exp(loss):.4f}")
    print("per window:", " ".join(f"{x:.6f}" for x in losses))


if __name__ == "__main__":
    main()
