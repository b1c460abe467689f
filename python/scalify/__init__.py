"""Scalify from Python: exact low-precision formats, block scaling, typed training recipes and the
GPT trainer, over the C++ library.

    import numpy as np, scalify
    x = np.random.randn(1024).astype(np.float32)
    codes = scalify.quantize(x, "e4m3")              # float8_e4m3fn codes, nearest even, saturating
    back = scalify.dequantize(codes)                 # the codes' dtype says their format
    run = scalify.train("runs/a", recipe="nvfp4", steps=100, d_model=64, layers=2)

Arrays cross without a copy when they are C-contiguous float32 on the CPU (NumPy, or any tensor
with DLPack such as a CPU torch.Tensor); other inputs are converted first. Errors of the C++ side
are ValueError with its message.
"""

import os as _os
import sys as _sys

# Whether torch's own libgomp loaded before scalify chose OpenMP's spin count (scalify.torch warns).
_torch_spins_long = "torch" in _sys.modules and not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(_os.environ)

# First: libgomp, loaded with _scalify, reads OpenMP's spin count once (platform/openmp_wait.hpp).
from . import _openmp_wait as _openmp_wait  # noqa: E402,I001
from ._scalify import unit as unit
from ._scalify import (
    Tensor as Tensor,
    add as add,
    as_scaled as as_scaled,
    cast_on_backward as cast_on_backward,
    cast_on_forward as cast_on_forward,
    causal_self_attention as causal_self_attention,
    cross_entropy as cross_entropy,
    dynamic_rescale as dynamic_rescale,
    dynamic_rescale_grad as dynamic_rescale_grad,
    embedding as embedding,
    exp as exp,
    gelu as gelu,
    gelu_erf as gelu_erf,
    layer_norm as layer_norm,
    log as log,
    log_softmax as log_softmax,
    matmul as matmul,
    mean as mean,
    mul as mul,
    rebalance as rebalance,
    relu as relu,
    reshape as reshape,
    set_scaling as set_scaling,
    sigmoid as sigmoid,
    silu as silu,
    softmax as softmax,
    sum as sum,
    tanh as tanh,
    transpose as transpose,
    ForwardGemm as ForwardGemm,
    HighPrecisionLayers as HighPrecisionLayers,
    InputGradGemm as InputGradGemm,
    LinearRecipe as LinearRecipe,
    QuantizerConfig as QuantizerConfig,
    Recipe as Recipe,
    StateFormat as StateFormat,
    WeightGradGemm as WeightGradGemm,
)
from ._formats import amax, block_dequantize, block_quantize, dequantize, formats, quantize
from ._recipes import preset, preset_names
from ._sweep import SweepCell, SweepResult, SweepVerdict, sweep
from ._training import Gpt, compare, inspect, load_checkpoint, read_metrics, train, training_batch

__all__ = [
    # number formats
    "quantize",
    "dequantize",
    "amax",
    "block_quantize",
    "block_dequantize",
    "formats",
    # recipes
    "Recipe",
    "LinearRecipe",
    "ForwardGemm",
    "InputGradGemm",
    "WeightGradGemm",
    "QuantizerConfig",
    "HighPrecisionLayers",
    "StateFormat",
    "preset",
    "preset_names",
    # tensors, autograd and ops
    "Tensor",
    "as_scaled",
    "add",
    "mul",
    "matmul",
    "sum",
    "mean",
    "reshape",
    "transpose",
    "relu",
    "gelu",
    "gelu_erf",
    "silu",
    "tanh",
    "sigmoid",
    "exp",
    "log",
    "softmax",
    "log_softmax",
    "layer_norm",
    "cross_entropy",
    "embedding",
    "causal_self_attention",
    # SCALIFY's scale primitives
    "set_scaling",
    "rebalance",
    "dynamic_rescale",
    "dynamic_rescale_grad",
    "cast_on_forward",
    "cast_on_backward",
    # unit scaling's ops
    "unit",
    # training
    "Gpt",
    "training_batch",
    "train",
    "compare",
    "sweep",
    "SweepResult",
    "SweepCell",
    "SweepVerdict",
    "read_metrics",
    "load_checkpoint",
    "inspect",
]
