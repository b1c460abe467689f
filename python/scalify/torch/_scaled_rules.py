"""The aten ops ScaledTensor has rules for: each calls the engine's scaled op through
``scalify._scalify.scaled`` (the rule's one home, src/scalify/scaled/), or moves data only and
keeps the scale (views, copies: the engine's shape-op rule Z_s = X_s)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch.utils._pytree import tree_map

from .._scalify import scaled as engine
from ._scaled_tensor import FAMILY_RULES, FUNCTIONS, OUT_RULE, RULES, STORAGE_NAMES, Pair, ScaledTensor, fallback, pair, scaled

aten = torch.ops.aten


def rule(*ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            RULES[op] = fn
        return fn
    return register


def rescaled(t: torch.Tensor, storage: torch.dtype) -> ScaledTensor:
    """A plain floating tensor as a ScaledTensor: scale rms(t) rounded down to a power of two,
    data t / scale stored in `storage` (the engine's as_scaled)."""
    data, scale = engine.as_scaled(t.detach().to(torch.float32).contiguous(), STORAGE_NAMES.get(storage, "f32"))
    return ScaledTensor(data, 1.0 if scale is None else scale)


def _number(x: Any) -> Optional[float]:
    """x as a number when it is one (a Python number or a plain single-element tensor: a weak
    scalar, as the engine's broadcast constants), else None."""
    if isinstance(x, numbers.Number) and not isinstance(x, bool):
        return float(x)  # type: ignore[arg-type]
    if isinstance(x, torch.Tensor) and not isinstance(x, ScaledTensor) and x.numel() == 1 and x.dim() == 0:
        return float(x.item())
    return None


def _in_storage(x: Any, storage: torch.dtype) -> Any:
    """x's data rounded into `storage` as the engine rounds (nearest even, saturating)."""
    if not isinstance(x, ScaledTensor) or x._data.dtype == storage:
        return x
    data, _ = engine.cast_data((x._data.contiguous(), x._scale), STORAGE_NAMES[storage])
    return ScaledTensor(data, x._scale)


# --- Arithmetic -------------------------------------------------------------------------------


def _binary(op: str, x: Any, y: Any) -> Any:
    c = _number(y)
    if c is not None and op in ("add", "sub", "mul", "div"):
        if op == "sub":
            op, c = "add", -c
        elif op == "div" and c != 0:
            op, c = "mul", 1.0 / c
        elif op == "div":  # x / 0: inf, -inf or NaN as torch gives, through the div rule
            return scaled(engine.binary("div", pair(x), (torch.tensor(0.0), None)))
        return scaled(engine.scalar(op, pair(x), c))
    c = _number(x)
    if c is not None and op in ("add", "mul"):
        return scaled(engine.scalar(op, pair(y), c))
    if c is not None and op == "sub":  # c - y
        return scaled(engine.scalar("add", engine.scalar("mul", pair(y), -1.0), c))
    return scaled(engine.binary(op, _as_pair(x), _as_pair(y)))


def _as_pair(x: Any) -> Pair:
    c = _number(x)
    if c is not None and not isinstance(x, torch.Tensor):
        return torch.tensor(c, dtype=torch.float32), None
    return pair(x)


def _alpha(y: Any, alpha: Any) -> Any:
    return y if alpha == 1 else _binary("mul", y, alpha)


@rule(aten.add.Tensor, aten.add.Scalar)
def _add(func: Any, x: Any, y: Any, *, alpha: Any = 1) -> Any:
    """scaled.binary add (a number: scaled.scalar add)."""
    return _binary("add", x, _alpha(y, alpha))


@rule(aten.sub.Tensor, aten.sub.Scalar)
def _sub(func: Any, x: Any, y: Any, *, alpha: Any = 1) -> Any:
    """scaled.binary sub (a number: scaled.scalar add of -c)."""
    return _binary("sub", x, _alpha(y, alpha))


@rule(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(func: Any, x: Any, y: Any, *, alpha: Any = 1) -> Any:
    """scaled.binary sub with the operands swapped."""
    return _binary("sub", y, _alpha(x, alpha))


@rule(aten.mul.Tensor, aten.mul.Scalar)
def _mul(func: Any, x: Any, y: Any) -> Any:
    """scaled.binary mul (a number: scaled.scalar mul)."""
    return _binary("mul", x, y)


@rule(aten.div.Tensor, aten.div.Scalar)
def _div(func: Any, x: Any, y: Any) -> Any:
    """scaled.binary div (a number: scaled.scalar mul of 1/c)."""
    return _binary("div", x, y)


@rule(aten.maximum.default)
def _maximum(func: Any, x: Any, y: Any) -> Any:
    """scaled.binary maximum."""
    return scaled(engine.binary("maximum", pair(x), pair(y)))


@rule(aten.minimum.default)
def _minimum(func: Any, x: Any, y: Any) -> Any:
    """scaled.binary minimum."""
    return scaled(engine.binary("minimum", pair(x), pair(y)))


@rule(aten.mm.default, aten.bmm.default)
def _mm(func: Any, x: Any, y: Any) -> Any:
    """scaled.binary matmul."""
    return scaled(engine.binary("matmul", pair(x), pair(y)))


@rule(aten.addmm.default, aten.baddbmm.default)
def _addmm(func: Any, bias: Any, x: Any, y: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """scaled.binary matmul, then add (the bias added as the engine's linear adds it)."""
    product = _alpha(scaled(engine.binary("matmul", pair(x), pair(y))), alpha)
    return _binary("add", product, _alpha(bias, beta))


_UNARY = {aten.exp.default: "exp", aten.log.default: "log", aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt",
          aten.abs.default: "abs", aten.relu.default: "relu", aten.sigmoid.default: "sigmoid", aten.tanh.default: "tanh",
          aten.silu.default: "silu", aten.neg.default: "neg"}


@rule(*_UNARY)
def _unary(func: Any, x: Any) -> Any:
    """scaled.unary (exp, log, sqrt, rsqrt, abs, relu, sigmoid, tanh, silu, neg)."""
    return scaled(engine.unary(_UNARY[func], pair(x)))


@rule(aten.gelu.default)
def _gelu(func: Any, x: Any, *, approximate: str = "none") -> Any:
    """scaled.unary gelu_tanh / gelu_erf."""
    return scaled(engine.unary("gelu_tanh" if approximate == "tanh" else "gelu_erf", pair(x)))


@rule(aten.pow.Tensor_Scalar)
def _pow(func: Any, x: Any, p: Any) -> Any:
    """scaled.scalar pow (the powers rule)."""
    return scaled(engine.scalar("pow", pair(x), float(p)))


# --- Reductions, normalisations, losses -------------------------------------------------------


def _dims(x: Any, dim: Any) -> List[int]:
    if dim is None:
        return []
    return [int(d) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]


@rule(aten.sum.default, aten.sum.dim_IntList)
def _sum(func: Any, x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """scaled.reduce sum."""
    if dtype not in (None, torch.float32):
        return fallback(func, (x, dim, keepdim), {"dtype": dtype})
    return scaled(engine.reduce("sum", pair(_in_storage(x, dtype) if dtype else x), _dims(x, dim), keepdim))


@rule(aten.mean.default, aten.mean.dim)
def _mean(func: Any, x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """scaled.reduce mean."""
    if dtype not in (None, torch.float32):
        return fallback(func, (x, dim, keepdim), {"dtype": dtype})
    return scaled(engine.reduce("mean", pair(_in_storage(x, dtype) if dtype else x), _dims(x, dim), keepdim))


@rule(aten.amax.default)
def _amax(func: Any, x: Any, dim: Sequence[int] = (), keepdim: bool = False) -> Any:
    """scaled.reduce amax (one dimension)."""
    if len(dim) != 1:
        return fallback(func, (x, dim, keepdim), {})
    return scaled(engine.reduce("amax", pair(x), list(dim), keepdim))


@rule(aten._softmax.default)
def _softmax(func: Any, x: Any, dim: int, half_to_float: bool) -> Any:
    """scaled.softmax."""
    return scaled(engine.softmax(pair(x), dim))


@rule(aten._safe_softmax.default)
def _safe_softmax(func: Any, x: Any, dim: int, dtype: Any = None) -> Any:
    """scaled.softmax, rows of -inf giving zeros."""
    # softmax, with rows that are all -inf (fully masked) giving zeros instead of NaN
    data, scale = engine.softmax(pair(x), dim)
    return scaled((torch.nan_to_num(data, nan=0.0), scale))


@rule(aten._log_softmax.default)
def _log_softmax(func: Any, x: Any, dim: int, half_to_float: bool) -> Any:
    """scaled.softmax log=True."""
    return scaled(engine.softmax(pair(x), dim, log=True))


@rule(aten.embedding.default)
def _embedding(func: Any, weight: Any, ids: torch.Tensor, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> Any:
    """scaled.embedding."""
    return scaled(engine.embedding(pair(weight), ids.to(torch.int64).contiguous()))


@rule(aten.where.self)
def _where(func: Any, cond: torch.Tensor, x: Any, y: Any) -> Any:
    """scaled.where."""
    return scaled(engine.where(cond.to(torch.float32).contiguous(), _as_pair(x), _as_pair(y)))


@rule(aten.masked_fill.Scalar)
def _masked_fill(func: Any, x: Any, mask: torch.Tensor, value: Any) -> Any:
    """scaled.where with the fill (0, +-inf: ANY scale)."""
    fill = torch.tensor(float(value), dtype=torch.float32)
    # A fill whose value ignores scale (0, +-inf) is ANY: it keeps x's scale.
    any_scale = float(value) == 0.0 or not torch.isfinite(fill).item()
    return scaled(engine.where(mask.to(torch.float32).contiguous(), (fill, 0.0 if any_scale else None), pair(x)))


@rule(aten.cat.default)
def _cat(func: Any, xs: Sequence[Any], dim: int = 0) -> Any:
    """scaled.concat."""
    # torch.cat skips 1-D empty tensors whatever their dimension (a key/value cache's start).
    kept = [x for x in xs if not (x.dim() == 1 and x.numel() == 0)]
    if len(kept) <= 1:
        return (kept or list(xs))[0].clone()
    return scaled(engine.concat([pair(x) for x in kept], dim))


@rule(aten.stack.default)
def _stack(func: Any, xs: Sequence[Any], dim: int = 0) -> Any:
    """unsqueeze, then scaled.concat."""
    return _cat(func, [x.unsqueeze(dim) for x in xs], dim)


# --- Data movement: the shape-op rule, Z_s = X_s -----------------------------------------------

_DATA_OPS = [aten.view.default, aten._unsafe_view.default, aten.t.default, aten.transpose.int, aten.permute.default,
             aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.slice.Tensor,
             aten.select.int, aten.alias.default, aten.detach.default, aten.clone.default, aten.lift_fresh.default,
             aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.slice_backward.default,
             aten.select_backward.default, aten.as_strided.default, aten.contiguous.default, aten.unfold.default,
             aten.flip.default, aten.roll.default, aten.repeat.default, aten.constant_pad_nd.default,
             aten.index_select.default, aten.gather.default]


@rule(*_DATA_OPS)
def _data_op(func: Any, *args: Any, **kwargs: Any) -> Any:
    """the op on the data, the scale kept (shape ops: Z_s = X_s)."""
    scaled_args = [a for a in args if isinstance(a, ScaledTensor)]
    if len(scaled_args) != 1 or (func is aten.constant_pad_nd.default and len(args) > 2 and args[2] != 0):
        return fallback(func, args, kwargs)
    scale = scaled_args[0]._scale
    out = func(*tree_map(lambda a: a._data if isinstance(a, ScaledTensor) else a, args), **kwargs)
    aliases = any(r.alias_info is not None for r in func._schema.returns)  # a view: in-place writes must reach the base

    def wrapped(t: torch.Tensor) -> ScaledTensor:
        if not aliases:
            return ScaledTensor(t, scale)
        w = ScaledTensor(t, scale, view_of=scaled_args[0])
        w._scalify_view = True  # type: ignore[attr-defined]
        return w

    return tree_map(lambda t: wrapped(t) if isinstance(t, torch.Tensor) else t, out)


@rule(aten._to_copy.default)
def _to_copy(func: Any, x: Any, *, dtype: Any = None, **kwargs: Any) -> Any:
    """the data into another storage (scaled.cast_data when narrower), the scale kept."""
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        raise TypeError(f"scalify.torch: ScaledTensor runs on the CPU; .to({device}) needs .unscaled() first")
    if dtype is None or dtype == x._data.dtype:
        return ScaledTensor(x._data.clone(), x._scale)
    if dtype in STORAGE_NAMES:  # another storage for the data, the scale kept (narrowing saturates)
        return _in_storage(x, dtype)
    return func(x.unscaled(), dtype=dtype, **kwargs)  # an integer or complex dtype: out of the scaled world


@rule(aten.zeros_like.default, aten.empty_like.default, aten.ones_like.default)
def _like(func: Any, x: Any, *, dtype: Any = None, **kwargs: Any) -> Any:
    """zeros: ANY scale; ones / empty: scale 1; an optimizer's state in its storage."""
    # A parameter's zeros are an optimizer's state: in the storage scalify() gave it.
    storage = dtype or getattr(x, "_state_storage", None) or x._data.dtype
    return _new(func is aten.zeros_like.default, func(x._data, dtype=storage, **kwargs))


@rule(aten.new_zeros.default, aten.new_empty.default, aten.new_empty_strided.default, aten.new_ones.default)
def _new_like(func: Any, x: Any, *args: Any, dtype: Any = None, **kwargs: Any) -> Any:
    """zeros: ANY scale; ones / empty: scale 1."""
    return _new(func is aten.new_zeros.default, func(x._data, *args, dtype=dtype or x._data.dtype, **kwargs))


def _new(zeros: bool, data: torch.Tensor) -> ScaledTensor:
    return ScaledTensor(data, 0.0 if zeros else 1.0)  # zeros ignore their scale: ANY


@rule(aten._local_scalar_dense.default)
def _item(func: Any, x: Any) -> Any:
    """the represented value."""
    return x.unscaled().item()


@rule(aten.is_same_size.default)
def _same_size(func: Any, x: Any, y: Any) -> bool:
    """the shapes compared."""
    return bool(x.shape == y.shape)


# --- In place: the out-of-place rule, its value written in the tensor's storage ---------------------


def assign(target: Any, value: Any, keep_scale: Optional[bool] = None) -> Any:
    """target <- value, written into target's data in place (its views, which share data and scale,
    see the write) in target's storage. A parameter keeps its scale, as the engine's optimizer
    restores a parameter's scale after its update (a weight decay of 0.999 by the mul_scalar rule
    alone would halve the scale and double the data at every step), unless the value no longer
    fits its storage at that scale; a view (a[:2], p.data) keeps it too, as the rest of its base
    holds data at it (a value that does not fit is refused). Any other target (a gradient torch
    accumulates in place, an optimizer's moment) takes the value's scale, as the engine's ops give
    it; so does a target of ANY scale (zeros, which any scale represents, its base's included)."""
    if not isinstance(target, ScaledTensor):
        raise TypeError("scalify.torch: an in-place op on a plain tensor with a ScaledTensor operand would drop the scale; "
                        "make the target a ScaledTensor (scalify.torch.as_scaled)")
    storage = target._data.dtype
    if not isinstance(value, ScaledTensor):
        value = rescaled(value, storage)
    parameter = isinstance(target, torch.nn.Parameter)
    view = target.is_view and not parameter  # (a Parameter is made from a detached tensor)
    keep = (parameter if keep_scale is None else keep_scale) or view
    if keep and target._scale != 0.0 and value._scale != target._scale:
        kept = value
        if value._scale != 0.0:
            kept = scaled(engine.set_scaling((value._data.to(torch.float32).contiguous(), value._scale), target._scale))
        finite = torch.isfinite(kept._data)
        if bool((kept._data[finite].abs() <= torch.finfo(storage).max).all()):
            value = kept
        elif view:
            raise ValueError(f"scalify.torch: an in-place result does not fit {storage} at the scale {target._scale} of the "
                             "tensor this is a view of; write the whole tensor instead")
    value = _in_storage(value, storage)
    target._data.copy_(value._data)
    if value._scale != 0.0 or target._scale == 0.0:  # ANY data (zeros, +-inf) holds at the target's scale
        target._scale = value._scale
    return target


_INPLACE = {aten.add_.Tensor: aten.add.Tensor, aten.add_.Scalar: aten.add.Tensor, aten.sub_.Tensor: aten.sub.Tensor,
            aten.mul_.Tensor: aten.mul.Tensor, aten.mul_.Scalar: aten.mul.Tensor, aten.div_.Tensor: aten.div.Tensor,
            aten.div_.Scalar: aten.div.Tensor}


@rule(*_INPLACE)
def _inplace(func: Any, x: Any, y: Any, **kwargs: Any) -> Any:
    """the out-of-place rule, in the target's storage (a parameter keeps its scale)."""
    out_of_place = _INPLACE[func]
    return assign(x, RULES[out_of_place](out_of_place, x, y, **kwargs))


def _promoted(*xs: Any) -> torch.dtype:
    """The storage the engine's data-precision rule gives an op on xs: float64 if any, float32 if
    any or if two narrow storages meet, else their one narrow storage."""
    storages = {x._data.dtype if isinstance(x, ScaledTensor) else x.dtype for x in xs if isinstance(x, torch.Tensor)}
    if torch.float64 in storages:
        return torch.float64
    return storages.pop() if len(storages) == 1 else torch.float32


def _fused(op: str, x: Any, a: Any, b: Any, value: Any) -> Any:
    """x + value * (a op b) as one op: computed in the storage all three promote to (an
    optimizer's float32 moment stays float32 through the float16 gradient's square, which on its
    own rounds into float16 and underflows)."""
    storage = _promoted(x, a, b)
    return _binary("add", x, _alpha(_binary(op, _in_storage(a, storage), _in_storage(b, storage)), value))


@rule(aten.addcmul_.default)
def _addcmul_(func: Any, x: Any, a: Any, b: Any, *, value: Any = 1) -> Any:
    """scaled.binary mul and add in the operands' promoted storage (a parameter keeps its scale)."""
    return assign(x, _fused("mul", x, a, b, value))


@rule(aten.addcdiv_.default)
def _addcdiv_(func: Any, x: Any, a: Any, b: Any, *, value: Any = 1) -> Any:
    """scaled.binary div and add in the operands' promoted storage (a parameter keeps its scale)."""
    return assign(x, _fused("div", x, a, b, value))


@rule(aten.lerp_.Scalar)
def _lerp_(func: Any, x: Any, end: Any, weight: Any) -> Any:
    """scaled.ema (the moments' moving-average rule)."""
    # x + w (end - x) = (1 - w) x + w end: the engine's moving-average rule (its scale stationary).
    return assign(x, scaled(engine.ema(pair(x), pair(end), 1.0 - float(weight))), keep_scale=False)


@rule(aten.copy_.default)
def _copy_(func: Any, x: Any, src: Any, non_blocking: bool = False) -> Any:
    """the source's data and scale, in the target's storage."""
    return assign(x, src if isinstance(src, ScaledTensor) else src.detach(), keep_scale=False)


@rule(aten.zero_.default)
def _zero_(func: Any, x: Any) -> Any:
    """zeros, in place (any scale represents them)."""
    x._data.zero_()
    return x


# --- Losses -------------------------------------------------------------------------------------


def _picked_rows(target: torch.Tensor, ignore_index: int) -> "tuple[torch.Tensor, int]":
    keep = target != ignore_index
    return keep, int(keep.sum().item())


@rule(aten.nll_loss_forward.default)
def _nll_loss(func: Any, logp: Any, target: torch.Tensor, weight: Any, reduction: int, ignore_index: int) -> Any:
    """a gather, scaled.reduce sum in float32, scaled.scalar mul (the loss float32)."""
    # -mean of the log-probabilities picked by the targets: a gather (the scale kept), the sum rule
    # and a scalar. The sum reads the picked values in float32: a loss stays float32 whatever the
    # data storage, as the engine's cross-entropy keeps it.
    if weight is not None or reduction not in (1, 2) or logp.dim() != 2 or not isinstance(logp, ScaledTensor):
        return fallback(func, (logp, target, weight, reduction, ignore_index), {})
    keep, count = _picked_rows(target, ignore_index)
    picked = logp._data.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1).to(torch.float32) * keep
    total = engine.reduce("sum", (picked, logp._scale), [], False)
    loss = scaled(engine.scalar("mul", total, -1.0 / max(count, 1) if reduction == 1 else -1.0))
    return loss, torch.tensor(float(count))


@rule(aten.nll_loss_backward.default)
def _nll_loss_backward(func: Any, g: Any, logp: Any, target: torch.Tensor, weight: Any, reduction: int, ignore_index: int,
                       total_weight: torch.Tensor) -> Any:
    """-1 at the targets, scaled.binary mul by the gradient, scaled.scalar mul."""
    if weight is not None or reduction not in (1, 2) or logp.dim() != 2:
        return fallback(func, (g, logp, target, weight, reduction, ignore_index, total_weight), {})
    keep, count = _picked_rows(target, ignore_index)
    storage = logp._data.dtype if isinstance(logp, ScaledTensor) else logp.dtype
    # -1 at each kept row's target, 0 elsewhere (exact in any storage), times g / count.
    onehot = torch.zeros(logp.shape, dtype=storage)
    onehot.scatter_(1, target.clamp(min=0).unsqueeze(1), -keep.to(storage).unsqueeze(1))
    grad = engine.binary("mul", (onehot, None), pair(g))
    return scaled(engine.scalar("mul", grad, 1.0 / max(count, 1) if reduction == 1 else 1.0))


# --- Attention ----------------------------------------------------------------------------------


def _attention(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
               scale: Optional[float] = None, enable_gqa: bool = False) -> Any:
    """softmax(q k^T * scale + mask) v as its aten ops, each with its rule (torch's CPU kernel fuses them into an op no rule knows)."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        T, S = scores.shape[-2], scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T), float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    probabilities = torch.ops.aten._safe_softmax(scores, -1)  # a fully masked row gives zeros, as SDPA's
    if dropout_p != 0.0:
        probabilities = torch.nn.functional.dropout(probabilities, dropout_p)
    return probabilities @ v


FUNCTIONS[torch.nn.functional.scaled_dot_product_attention] = _attention


# --- Backward ops -------------------------------------------------------------------------------


@rule(aten.gelu_backward.default)
def _gelu_backward(func: Any, g: Any, x: Any, *, approximate: str = "none") -> Any:
    """scaled.unary_backward gelu_tanh / gelu_erf."""
    return scaled(engine.unary_backward("gelu_tanh" if approximate == "tanh" else "gelu_erf", pair(x), None, pair(g)))


@rule(aten.silu_backward.default)
def _silu_backward(func: Any, g: Any, x: Any) -> Any:
    """scaled.unary_backward silu."""
    return scaled(engine.unary_backward("silu", pair(x), None, pair(g)))


@rule(aten.tanh_backward.default, aten.sigmoid_backward.default)
def _from_output_backward(func: Any, g: Any, y: Any) -> Any:
    """scaled.unary_backward tanh / sigmoid (from the output)."""
    op = "tanh" if func is aten.tanh_backward.default else "sigmoid"
    return scaled(engine.unary_backward(op, None, pair(y), pair(g)))


@rule(aten.threshold_backward.default)
def _relu_backward(func: Any, g: Any, y: Any, threshold: float) -> Any:
    """scaled.unary_backward relu."""
    if threshold != 0:
        return fallback(func, (g, y, threshold), {})
    return scaled(engine.unary_backward("relu", pair(y), None, pair(g)))  # relu's output in its input's place: the same bits


@rule(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def _softmax_backward(func: Any, g: Any, y: Any, dim: int, input_dtype: Any) -> Any:
    """scaled.softmax_backward."""
    return scaled(engine.softmax_backward(pair(y), pair(g), dim, log=func is aten._log_softmax_backward_data.default))


@rule(aten.embedding_dense_backward.default)
def _embedding_backward(func: Any, g: Any, ids: torch.Tensor, num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> Any:
    """scaled.embedding_backward (the padding row zero)."""
    if scale_grad_by_freq:  # the engine's embedding has no such option
        return fallback(func, (g, ids, num_weights, padding_idx, scale_grad_by_freq), {})
    data, scale = engine.embedding_backward(pair(g), ids.to(torch.int64).contiguous(), num_weights)
    if padding_idx >= 0:  # the padding row learns nothing: its zeros keep the scale
        data[padding_idx] = 0
    return scaled((data, scale))


# --- Fused ops the engine has whole (torch functions, before aten splits them) ------------------


def _optional_pair(x: Any) -> Optional[Pair]:
    return None if x is None else pair(x)


class _Norm(torch.autograd.Function):
    """LayerNorm / RMSNorm with its affine as the engine's one fused op, forward and backward."""

    @staticmethod
    def forward(ctx: Any, x: Any, weight: Any, bias: Any, eps: float, center: bool) -> Any:
        ctx.save_for_backward(x, weight, bias)
        ctx.eps, ctx.center = eps, center
        y, _, _ = engine.fused_norm(pair(x), _optional_pair(weight), _optional_pair(bias), eps, center)
        return scaled(y)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        x, weight, bias = ctx.saved_tensors
        dx, dw, db = engine.fused_norm_backward(pair(g), pair(x), _optional_pair(weight), _optional_pair(bias), ctx.eps, ctx.center)
        return scaled(dx), None if dw is None else scaled(dw), None if db is None else scaled(db), None, None


def _fusable_norm(x: Any, weight: Any, bias: Any) -> bool:
    # The engine fuses a norm whose operands all carry one normal scale, or normalises a scaled x
    # without affine; others (a bias without a weight, ANY scales) compose ops.
    operands = [t for t in (x, weight, bias) if t is not None]
    return (weight is not None or bias is None) and all(isinstance(t, ScaledTensor) and t._scale != 0.0 for t in operands)


def _layer_norm(x: Any, normalized_shape: Sequence[int], weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """scaled.fused_norm / fused_norm_backward (the engine's LayerNorm with its affine)."""
    if len(normalized_shape) != 1 or not _fusable_norm(x, weight, bias):
        return NotImplemented
    return _Norm.apply(x, weight, bias, eps, True)


def _rms_norm(x: Any, normalized_shape: Sequence[int], weight: Any = None, eps: Optional[float] = None) -> Any:
    """scaled.fused_norm / fused_norm_backward center=False."""
    if len(normalized_shape) != 1 or not _fusable_norm(x, weight, None):
        return NotImplemented
    return _Norm.apply(x, weight, None, torch.finfo(x.dtype).eps if eps is None else eps, False)


class _CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy as the engine's fused op (its loss float32, its gradient's scale g / N)."""

    @staticmethod
    def forward(ctx: Any, logits: Any, targets: torch.Tensor) -> Any:
        ctx.save_for_backward(logits, targets)
        return scaled(engine.cross_entropy(pair(logits), targets))

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        logits, targets = ctx.saved_tensors
        return scaled(engine.cross_entropy_backward(pair(logits), targets, pair(g))), None


def _cross_entropy(logits: Any, targets: Any, weight: Any = None, size_average: Any = None, ignore_index: int = -100,
                   reduce: Any = None, reduction: str = "mean", label_smoothing: float = 0.0) -> Any:
    """scaled.cross_entropy / cross_entropy_backward (the loss float32)."""
    if (not isinstance(logits, ScaledTensor) or logits.dim() != 2 or weight is not None or size_average is not None
            or reduce is not None or reduction != "mean" or label_smoothing != 0.0 or bool((targets == ignore_index).any())):
        return NotImplemented  # aten's log_softmax and nll_loss, each with its rule
    return _CrossEntropy.apply(logits, targets.to(torch.int64).contiguous())


FUNCTIONS[torch.nn.functional.layer_norm] = _layer_norm
FUNCTIONS[torch.nn.functional.rms_norm] = _rms_norm
FUNCTIONS[torch.nn.functional.cross_entropy] = _cross_entropy


# --- Dropout: a random mask of 0 and 1 (any scale represents it), then the mul rule ---------------


@rule(aten.bernoulli_.float)
def _bernoulli_(func: Any, x: Any, p: float = 0.5, *, generator: Any = None) -> Any:
    """a 0/1 mask, scale 1 (written as any in-place result)."""
    return assign(x, ScaledTensor(torch.empty_like(x._data).bernoulli_(p, generator=generator), 1.0), keep_scale=False)


@rule(aten.native_dropout.default)
def _native_dropout(func: Any, x: Any, p: float, train: Optional[bool]) -> Any:
    """a 0/1 mask, scaled.binary mul, scaled.scalar mul of 1/(1-p)."""
    if not train or p == 0:
        return x.clone(), torch.ones(x.shape, dtype=torch.bool)
    if p >= 1:
        return ScaledTensor(torch.zeros_like(x._data), 0.0), torch.zeros(x.shape, dtype=torch.bool)
    keep = torch.empty(x.shape).bernoulli_(1 - p).to(torch.bool)
    return _binary("mul", _binary("mul", x, keep.to(x.dtype)), 1.0 / (1 - p)), keep


@rule(aten.native_dropout_backward.default)
def _native_dropout_backward(func: Any, g: Any, keep: torch.Tensor, scale: float) -> Any:
    """scaled.binary mul by the mask, scaled.scalar mul."""
    return _binary("mul", _binary("mul", g, keep.to(g.dtype)), scale)


def _foreach(func: Any, *args: Any, **kwargs: Any) -> Any:
    """each element through the op's single-tensor form (torch.Tensor.<op>), with its rule."""
    name = func.overloadpacket.__name__[len("_foreach_"):]
    single = getattr(torch.Tensor, name, None)
    if single is None and name.endswith("_"):  # an in-place op torch has only out of place (maximum_): the result assigned
        out_of_place = getattr(torch, name[:-1])
        single = lambda x, *a, **k: assign(x, out_of_place(x, *a, **k))  # noqa: E731
    elif single is None:
        single = getattr(torch, name)
    if name.rstrip("_") in ("addcmul", "addcdiv") and len(args) == 4:  # the list form's value is keyword-only alone
        value = args[3]
        kwargs = {**kwargs, "value": value.tolist() if isinstance(value, torch.Tensor) else value}
        args = args[:3]
    outs = [single(*[a[i] if isinstance(a, (list, tuple)) else a for a in args],
                   **{k: v[i] if isinstance(v, (list, tuple)) else v for k, v in kwargs.items()})
            for i in range(len(args[0]))]
    return None if name.endswith("_") else outs


FAMILY_RULES["_foreach_"] = _foreach


def _out_variant(func: Any, *args: Any, out: Any, **kwargs: Any) -> Any:
    """the default overload's rule, its result assigned to out."""
    default = func.overloadpacket.default
    return assign(out, RULES[default](default, *args, **kwargs))


OUT_RULE.append(_out_variant)


def rule_table() -> str:
    """The dispatch table as Markdown: each torch function and aten op ScaledTensor has a rule
    for, and the rule (docs/NUMERICS.md holds it; a test keeps the two equal)."""
    lines = ["| torch function or aten op | rule |", "|---|---|"]
    for function, fn in FUNCTIONS.items():
        lines.append(f"| `torch.nn.functional.{function.__name__}` | {(fn.__doc__ or '').splitlines()[0]} |")
    for prefix, fn in FAMILY_RULES.items():
        lines.append(f"| `aten.{prefix}*` | {(fn.__doc__ or '').splitlines()[0]} |")
    lines.append(f"| an op's `.out` overload, when its default has a rule | {(_out_variant.__doc__ or '').splitlines()[0]} |")
    by_rule: Dict[Any, List[str]] = {}
    for op, fn in RULES.items():
        by_rule.setdefault(fn, []).append(str(op))
    for fn, ops in by_rule.items():
        lines.append(f"| {', '.join(f'`{o}`' for o in sorted(ops))} | {(fn.__doc__ or '').splitlines()[0]} |")
    return "\n".join(lines) + "\n"
