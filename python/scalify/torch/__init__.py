"""Scalify's recipes inside any PyTorch model (needs PyTorch: ``pip install scalify[torch]``).

    import scalify.torch
    model = scalify.torch.convert(model, "mxfp8")     # every nn.Linear (and GPT-2 Conv1D) swapped
    ...train with any torch.optim optimizer...
    scalify.torch.statistics(model)                   # per-operand amax, scale, underflow, clipping

``Linear`` runs the engine's quantised linear layer (the one ``scalify train`` runs): each operand
of its three GEMMs is quantised as the recipe's ``LinearRecipe`` says (per-tensor current /
delayed / scaling bias, block, MX, NVFP4 with its tensor scale, stochastic rounding and random
Hadamard transform) and the GEMMs run on the exact codes (bf16 dot products where the CPU has
them), bit-identical to the engine. Everything else in the model (attention, norms, embeddings,
the optimizer) runs in torch's own precision: scale propagation through a whole torch graph is
another piece of work. Where a torch model must compute exactly what the engine computes, the
engine's own differentiable ops are ``scalify.torch.functional`` (layer_norm, gelu, softmax,
causal_self_attention, embedding, matmul, add, cross_entropy, and ``engine_op`` for any other).
"""

import warnings

from .. import _torch_spins_long
from ._accumulation import Accumulation, accumulation
from . import functional
from ._convert import convert, statistics
from ._linear import Linear
from . import _scaled_rules  # noqa: F401  (registers ScaledTensor's rules)
from ._scaled_functions import as_scaled, cast_on_backward, cast_on_forward, dynamic_rescale, dynamic_rescale_grad, rebalance, set_scaling
from ._scaled_tensor import ScaledTensor, unhandled_ops
from ._scalify_model import scalify

if _torch_spins_long:
    warnings.warn("torch was imported before scalify: torch's OpenMP threads spin 300,000 times at every barrier "
                  "and slow scalify.torch's layers down (2x measured on 2 cores); import scalify first, or set "
                  "GOMP_SPINCOUNT=1000 before starting Python", RuntimeWarning, stacklevel=2)

__all__ = ["Accumulation", "Linear", "ScaledTensor", "accumulation", "as_scaled", "cast_on_backward", "cast_on_forward", "convert",
           "dynamic_rescale", "dynamic_rescale_grad", "functional", "rebalance", "scalify", "set_scaling", "statistics", "unhandled_ops"]
