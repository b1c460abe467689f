"""SCALIFY's scale-setting functions on torch tensors, differentiable (jax-scalify's set of them):
as_scaled, set_scaling, rebalance, dynamic_rescale(_grad), cast_on_forward / cast_on_backward."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from .._scalify import scaled as engine
from ._scaled_rules import rescaled
from ._scaled_tensor import STORAGE_DTYPES, STORAGE_NAMES, ScaledTensor, pair, scaled

DTypeLike = Union[str, torch.dtype]


def _storage(dtype: DTypeLike) -> torch.dtype:
    storage = STORAGE_DTYPES.get(dtype) if isinstance(dtype, str) else dtype
    if storage not in STORAGE_NAMES:
        raise TypeError(f"scalify.torch: data is stored as float16, bfloat16, float32, float64 or float8 "
                        f"({', '.join(STORAGE_DTYPES)}), not {dtype}")
    return storage


def _plain_gradient(g: Any) -> Any:
    return g.unscaled() if isinstance(g, ScaledTensor) else g


class _AsScaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, storage: torch.dtype) -> ScaledTensor:
        return rescaled(x, storage)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        return _plain_gradient(g), None


def as_scaled(x: torch.Tensor, dtype: DTypeLike = torch.float32) -> ScaledTensor:
    """``x`` as a ScaledTensor: scale rms(x) rounded down to a power of two, data x / scale
    stored in ``dtype`` (float16, bfloat16, float32). Differentiable: the gradient reaches ``x``
    as a plain tensor. A ScaledTensor comes back as it is."""
    if isinstance(x, ScaledTensor):
        return x
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"as_scaled: needs a torch.Tensor, not {type(x).__name__}")
    out: ScaledTensor = _AsScaled.apply(x, _storage(dtype))
    return out


class _Rescale(torch.autograd.Function):
    """The value kept, the scale moved: on the forward pass (``forward_op``) or on the gradient."""

    @staticmethod
    def forward(ctx: Any, x: Any, forward_op: Optional[Any], backward_op: Optional[Any]) -> Any:
        ctx.backward_op = backward_op
        x = as_scaled(x) if not isinstance(x, ScaledTensor) else x
        return scaled(forward_op(pair(x))) if forward_op else ScaledTensor(x._data, x._scale)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        if ctx.backward_op is not None:
            g = scaled(ctx.backward_op(pair(g if isinstance(g, ScaledTensor) else rescaled(g, torch.float32))))
        return g, None, None


def set_scaling(x: torch.Tensor, scale: float) -> ScaledTensor:
    """The same value with scale ``scale`` (a power of two): the data rescaled exactly."""
    return _Rescale.apply(x, lambda p: engine.set_scaling(p, float(scale)), None)  # type: ignore[no-any-return]


def rebalance(x: torch.Tensor, delta: float) -> ScaledTensor:
    """scale * delta, data / delta (delta a power of two): the value kept."""
    return _Rescale.apply(x, lambda p: engine.rebalance(p, float(delta)), None)  # type: ignore[no-any-return]


def dynamic_rescale(x: torch.Tensor, by: str = "l2") -> ScaledTensor:
    """Rebalanced by its data's rms (``by="l2"``) or amax (``"max"``) rounded to a power of two:
    the data back near unit scale (SCALIFY's Algorithm 4). The gradient passes unchanged."""
    return _Rescale.apply(x, lambda p: engine.dynamic_rescale(p, by), None)  # type: ignore[no-any-return]


def dynamic_rescale_grad(x: torch.Tensor, by: str = "l2") -> ScaledTensor:
    """The identity on the forward pass; the gradient rebalanced as ``dynamic_rescale`` does."""
    return _Rescale.apply(x, None, lambda p: engine.dynamic_rescale(p, by))  # type: ignore[no-any-return]


def cast_on_forward(x: torch.Tensor, dtype: DTypeLike) -> ScaledTensor:
    """The data rounded into ``dtype`` (nearest even, saturating), the scale kept; the gradient
    passes unchanged."""
    name = STORAGE_NAMES[_storage(dtype)]
    return _Rescale.apply(x, lambda p: engine.cast_data(p, name), None)  # type: ignore[no-any-return]


def cast_on_backward(x: torch.Tensor, dtype: DTypeLike) -> ScaledTensor:
    """The identity on the forward pass; the gradient's data rounded into ``dtype``."""
    name = STORAGE_NAMES[_storage(dtype)]
    return _Rescale.apply(x, None, lambda p: engine.cast_data(p, name))  # type: ignore[no-any-return]
