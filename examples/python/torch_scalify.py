"""SCALIFY on a PyTorch model: the small causal language model of torch_convert.py, its parameters
made ScaledTensors by scalify.torch.scalify, trained with torch.optim.AdamW in float16 (FP8 matmul
operands under scalify_fp8_3) with no loss scaling, beside the same model in float32. Every op of
the forward, the backward and the optimizer propagates the scale by the engine's rule.
Run: python examples/python/torch_scalify.py [recipe]   (needs torch; default recipe scalify_fp8_3)"""

import sys

import scalify  # before torch: OpenMP's threads then wait briefly in both libraries
import scalify.torch
import torch
from torch_convert import TinyLM, train


def main() -> None:
    recipe = sys.argv[1] if len(sys.argv) > 1 else "scalify_fp8_3"
    torch.manual_seed(0)
    reference = TinyLM()
    scaled = TinyLM()
    scaled.load_state_dict(reference.state_dict())  # the same initial weights
    scalify.torch.scalify(scaled, recipe)
    print(f"f32:           final loss {train(reference):.4f}")
    print(f"{recipe:14s} final loss {train(scaled):.4f}")
    ids, _ = scalify.training_batch(0, batch=2, seq=64)
    logits = scaled(torch.from_numpy(ids))
    assert isinstance(logits, scalify.torch.ScaledTensor)
    print(f"logits: {logits.data_tensor.dtype} data with scale {logits.scale}")
    print("ops without a scale rule:", scalify.torch.unhandled_ops() or "none")


if __name__ == "__main__":
    main()
