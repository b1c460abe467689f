"""scalify.torch.ScaledTensor: a torch tensor held as (data, power-of-two scale), whose aten ops
propagate the scale by the engine's rules (SCALIFY, docs/SCALE_RULES.md)."""

from __future__ import annotations

import collections
import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.utils._pytree import tree_map

# A pair as the engine's bindings take it: (data, scale); scale None for an unscaled tensor, 0.0
# for ANY (a constant whose value ignores its scale: zeros, +-inf).
Pair = Tuple[torch.Tensor, Optional[float]]
Rule = Callable[..., Any]

# The data storages a ScaledTensor holds, by the engine's names for them.
STORAGE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
                 torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
STORAGE_DTYPES = {name: dtype for dtype, name in STORAGE_NAMES.items()}

# aten op (OpOverload, or its OpOverloadPacket for every overload) -> its rule (_scaled_rules.py).
RULES: Dict[Any, Rule] = {}
# aten op families by name prefix ("_foreach_") -> the rule for every op of the family.
FAMILY_RULES: Dict[str, Rule] = {}
# An op's out= overload (torch.maximum(a, b, out=c)) when its default overload has a rule.
OUT_RULE: List[Rule] = []
# torch functions ScaledTensor takes before they reach aten (a fused op the engine has whole, or one
# whose aten form has no scaled counterpart): function -> rule returning NotImplemented to decline.
FUNCTIONS: Dict[Any, Rule] = {}
_fallbacks: collections.Counter[str] = collections.Counter()


class ScaledTensor(torch.Tensor):
    """A tensor represented as ``data * scale``: ``data`` a float16, bfloat16, float32, float64,
    float8_e4m3fn or float8_e5m2 tensor on the CPU, ``scale`` a power of two (0.0: ANY, a constant
    whose value ignores its scale). Its torch dtype is its data's (as jax-scalify's ScaledArray
    has it: a float16 model's code that casts to ``x.dtype`` keeps float16, though the value may
    lie beyond float16's range, which the scale holds). Every aten op on it runs the engine's
    scaled op, which computes the output's scale from the inputs' scales and shapes (never from
    statistics) and rounds the output data into the storage its inputs' data promote to (float16
    data stays float16). Ops without a rule compute on the unscaled values in float32 and warn
    once (``scalify.torch.unhandled_ops()``); in-place ones write their result back."""

    _data: torch.Tensor
    # The scale, in a cell that every view of the same data shares (a[:2], x.detach(), p.data): one
    # scale for one storage, whichever of them changes it.
    _scale_cell: List[float]

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: float, *, requires_grad: bool = False,
                view_of: Optional["ScaledTensor"] = None) -> "ScaledTensor":
        if not isinstance(data, torch.Tensor) or isinstance(data, ScaledTensor):
            raise TypeError(f"ScaledTensor: data must be a plain torch.Tensor, not {type(data).__name__}")
        if data.dtype not in STORAGE_NAMES:
            raise TypeError(f"ScaledTensor: data must be float16, bfloat16, float32, float64, float8_e4m3fn or float8_e5m2, "
                            f"not {data.dtype}")
        if data.device.type != "cpu":
            raise TypeError(f"ScaledTensor: data on {data.device}; Scalify's rules run on the CPU")
        scale = float(scale)
        if scale != 0.0 and not (2.0**-126 <= scale <= 2.0**127 and math.frexp(scale)[0] == 0.5):
            raise ValueError(f"ScaledTensor: scale must be a power of two within float32's normal range (or 0.0 for ANY), not {scale}")
        t = torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), storage_offset=data.storage_offset(), dtype=data.dtype,
            device=data.device, requires_grad=requires_grad)
        t._data = data
        t._scale_cell = view_of._scale_cell if view_of is not None else [scale]
        t._scale_cell[0] = scale
        return t

    @property
    def _scale(self) -> float:
        return self._scale_cell[0]

    @_scale.setter
    def _scale(self, scale: float) -> None:
        self._scale_cell[0] = scale

    @property
    def is_view(self) -> bool:
        """Whether its data is a view of another ScaledTensor's (they share one scale)."""
        return bool(getattr(self, "_scalify_view", False))

    @property
    def data_tensor(self) -> torch.Tensor:
        """The data, without its scale."""
        return self._data

    @property
    def scale(self) -> float:
        """The power-of-two scale (0.0: ANY)."""
        return self._scale

    def unscaled(self) -> torch.Tensor:
        """The represented value data * scale as a plain float32 tensor (float64 for float64 data),
        differentiable."""
        value: torch.Tensor = _Unscale.apply(self)
        return value

    def __repr__(self) -> str:  # type: ignore[override]
        return f"ScaledTensor(data={self._data!r}, scale={self._scale!r})"

    def __tensor_flatten__(self) -> Tuple[list[str], Dict[str, Any]]:
        return ["_data"], {"scale": self._scale}

    @staticmethod
    def __tensor_unflatten__(inner: Dict[str, torch.Tensor], meta: Dict[str, Any], outer_size: Any, outer_stride: Any) -> "ScaledTensor":
        return ScaledTensor(inner["_data"], meta["scale"])

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            rule = FUNCTIONS.get(func)
            if rule is not None:
                out = rule(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Tuple[Any, ...] = (),  # type: ignore[override]
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        if any(not issubclass(t, (ScaledTensor, torch.Tensor)) or (issubclass(t, torch.Tensor) and t not in (ScaledTensor, torch.Tensor))
               for t in types):
            return NotImplemented  # another subclass: let its handler run
        kwargs = kwargs or {}
        rule = RULES.get(func) or RULES.get(func.overloadpacket)
        if rule is None:
            name = func.overloadpacket.__name__
            rule = next((r for prefix, r in FAMILY_RULES.items() if name.startswith(prefix)), None)
        if rule is None and func._overloadname == "out" and RULES.get(getattr(func.overloadpacket, "default", None)):
            rule = OUT_RULE[0]
        if rule is None:
            return fallback(func, args, kwargs)
        return rule(func, *args, **kwargs)


class _Unscale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: ScaledTensor) -> Any:
        return _value(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return g


def pair(x: Any) -> Pair:
    """A tensor as the bindings take it: a ScaledTensor's (data, scale) (contiguous), a plain
    tensor as unscaled."""
    if isinstance(x, ScaledTensor):
        return x._data.contiguous(), x._scale
    if isinstance(x, torch.Tensor):
        return x.contiguous(), None
    raise TypeError(f"scalify.torch: a tensor operand expected, got {type(x).__name__}")


def scaled(p: Pair) -> Any:
    """The bindings' output pair as a ScaledTensor (a plain tensor when unscaled)."""
    data, scale = p
    return data if scale is None else ScaledTensor(data, scale)


def _value(x: Any) -> Any:
    if not isinstance(x, ScaledTensor):
        return x
    wide = torch.float64 if x._data.dtype == torch.float64 else torch.float32
    return x._data.to(wide) * (x._scale or 1.0)  # ANY (0.0): the data is the value (zeros, +-inf)


def fallback(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """An op without a rule: computed on the unscaled values in float32 (float64 stays), each
    floating output scaled again (as_scaled) with its data in the dtype the op gives for the
    inputs' dtypes; warned once per op."""
    name = str(func)
    if _fallbacks[name] == 0:
        warnings.warn(f"scalify.torch: no scale rule for {name}: computed on unscaled float32 values "
                      "(scalify.torch.unhandled_ops() lists every such op)", RuntimeWarning, stacklevel=3)
    _fallbacks[name] += 1
    out = func(*tree_map(_wide_value, args), **tree_map(_wide_value, kwargs))
    try:  # the output dtypes for the inputs' own dtypes, from torch's meta kernels
        dtypes = tree_map(lambda t: t.dtype if isinstance(t, torch.Tensor) else None,
                          func(*tree_map(_meta, args), **tree_map(_meta, kwargs)))
    except Exception:  # noqa: BLE001 (an op without a meta kernel: the computed dtypes)
        dtypes = tree_map(lambda t: t.dtype if isinstance(t, torch.Tensor) else None, out)
    from ._scaled_rules import assign, rescaled  # noqa: PLC0415 (the rules import this module)
    result = _zip_map(lambda t, d: rescaled(t, d) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out, dtypes)
    written = _written_arguments(func, args, kwargs)
    if written:  # an in-place or out= op: its result goes into the tensor it writes
        if len(written) != 1 or not isinstance(written[0], ScaledTensor):
            raise TypeError(f"scalify.torch: {name} writes {len(written)} tensors in place and has no scale rule")
        return assign(written[0], result[0] if isinstance(result, (tuple, list)) else result, keep_scale=False)
    return result


def _written_arguments(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> list[Any]:
    """The arguments an op writes into (its schema's mutable aliases: self of an in-place op, out=)."""
    written: list[Any] = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(a.name)
            written.extend(value if isinstance(value, (list, tuple)) else [value])
    return [w for w in written if isinstance(w, torch.Tensor)]


def _wide_value(x: Any) -> Any:
    if isinstance(x, torch.dtype):  # a dtype argument (input_dtype=): the one the values now have
        return torch.float32 if x in (torch.float16, torch.bfloat16) else x
    if isinstance(x, ScaledTensor):
        return _value(x)
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        return x.to(torch.float32)
    return x


def _meta(x: Any) -> Any:
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta") if isinstance(x, torch.Tensor) else x


def _zip_map(fn: Callable[[Any, Any], Any], out: Any, dtypes: Any) -> Any:
    if isinstance(out, (tuple, list)):
        return type(out)(_zip_map(fn, o, d) for o, d in zip(out, dtypes))
    return fn(out, dtypes)


def _flat(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> list[Any]:
    flat: list[Any] = []
    tree_map(lambda a: flat.append(a), (args, kwargs))
    return flat


def unhandled_ops() -> Dict[str, int]:
    """Every aten op that ran on ScaledTensors without a scale rule (the unscaled float32
    fallback), with how many times: empty when every op of a model has its rule."""
    return dict(_fallbacks)


# torch.load(weights_only=True), the default, may rebuild ScaledTensors (a scalified model's state_dict).
torch.serialization.add_safe_globals([ScaledTensor])
