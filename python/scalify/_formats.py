"""Number formats: quantize / dequantize elementwise and block-scaled, and the formats' table.

A format is a name ("e4m3", or an alias such as "float8_e4m3fn"), a NumPy / ml_dtypes dtype or a
torch dtype (torch is only used when you pass torch objects; ``import scalify`` never imports it):

    =============  =====================================  ==================================
    format         NumPy / ml_dtypes dtype                torch dtype
    =============  =====================================  ==================================
    f32            numpy.float32                          torch.float32
    bf16           ml_dtypes.bfloat16                     torch.bfloat16
    f16            numpy.float16                          torch.float16
    e4m3           ml_dtypes.float8_e4m3fn                torch.float8_e4m3fn
    e5m2           ml_dtypes.float8_e5m2                  torch.float8_e5m2
    e4m3fnuz       ml_dtypes.float8_e4m3fnuz              torch.float8_e4m3fnuz
    e5m2fnuz       ml_dtypes.float8_e5m2fnuz              torch.float8_e5m2fnuz
    e4m3b11fnuz    ml_dtypes.float8_e4m3b11fnuz           (none: torch.uint8 codes)
    e8m0           ml_dtypes.float8_e8m0fnu               torch.float8_e8m0fnu
    e2m3           ml_dtypes.float6_e2m3fn                (none: torch.uint8 codes)
    e3m2           ml_dtypes.float6_e3m2fn                (none: torch.uint8 codes)
    e2m1           ml_dtypes.float4_e2m1fn (one a byte)   torch.float4_e2m1fn_x2 (packed)
    int8           numpy.int8 (symmetric, ±127)           torch.int8
    =============  =====================================  ==================================

Codes come back typed: a NumPy array of the format's dtype (a view of the codes, no copy) for
NumPy inputs and array-likes, a torch tensor of the torch dtype for torch inputs (torch.uint8
codes where torch has no dtype for the format). ``raw=True`` gives the bare uint8 / uint16 /
uint32 codes. Typed codes carry their format back into ``dequantize``; raw codes need it named.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, List, Literal, Optional, Tuple, Union, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _dtypes, _scalify

if TYPE_CHECKING:
    import torch

# A format: its name, a NumPy / ml_dtypes dtype (or scalar type) or a torch dtype.
FormatLike = Union[str, "np.dtype[Any]", "type[Any]", "torch.dtype"]
RawCodes = NDArray[np.unsignedinteger[Any]]


def _float32_input(x: object, op: str) -> Tuple[Any, bool]:
    """(x as the bindings read it: float32, without a copy where it already is; whether x is torch's)."""
    if _dtypes.is_torch(x):
        t: Any = x
        if not t.is_floating_point():
            raise TypeError(f"{op}: x must hold floats, got a torch tensor of {t.dtype}")
        return t.detach().float().contiguous(), True
    if isinstance(x, (list, tuple, int, float)):
        try:
            return np.asarray(x, dtype=np.float32), False
        except (TypeError, ValueError) as e:
            raise TypeError(f"{op}: x must be an array or a sequence of numbers ({e})") from None
    if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
        return x, False  # another DLPack tensor: the bindings read float32 ones in place
    a = np.asarray(x)
    if a.dtype.kind != "f" and not (a.dtype.kind == "V" and a.dtype in _dtypes._FORMAT_OF_NUMPY):
        raise TypeError(f"{op}: x must hold floats, got an array of {a.dtype.name}")
    return a if a.dtype == np.float32 else a.astype(np.float32), False


def _typed(codes: Any, fmt: str, packed: bool, torch_out: bool, raw: bool) -> Any:
    """Raw codes from the bindings as the caller gets them: packed, typed, torch (all views)."""
    if packed:
        codes = _dtypes.pack_fp4(codes)
    if torch_out:
        torch = sys.modules["torch"]
        t = torch.from_numpy(codes)
        dtype = None if raw else _dtypes.torch_dtype(fmt, packed)
        return t if dtype is None else t.view(dtype)
    return codes if raw or packed else codes.view(_dtypes.numpy_dtype(fmt))


def _check_packed(fmt: str, packed: bool, op: str) -> None:
    if packed and fmt != "e2m1":
        raise ValueError(f"{op}: packed=True is for e2m1 (two 4-bit codes a byte), not {fmt}")


def _codes_and_format(codes: object, format: Optional[FormatLike], packed: bool, op: str) -> Tuple[Any, str, bool]:
    """(raw NumPy codes, one a code, the format's name, whether codes is torch's) of codes given
    typed or raw; refuses typed codes of another format than the one named."""
    own, own_packed = _dtypes.codes_format(codes)
    if format is None:
        if own is None:
            dtype = getattr(codes, "dtype", type(codes).__name__)
            raise TypeError(f"{op}: codes of {dtype} do not say their format: name it (format='e4m3', ...)")
        fmt = own
    else:
        fmt, fmt_packed = _dtypes.resolve(format, op)
        own_packed = own_packed or fmt_packed
        if own is not None and own != fmt:
            raise TypeError(f"{op}: the codes are {own} codes ({getattr(codes, 'dtype')}), not {fmt} codes")
    if packed and own is not None and not own_packed:
        raise ValueError(f"{op}: packed=True, but the codes are typed {getattr(codes, 'dtype')}, one code a byte")
    packed = packed or own_packed
    _check_packed(fmt, packed, op)
    is_torch = _dtypes.is_torch(codes)
    if not is_torch:
        codes = np.asarray(codes)
        if own is None and codes.dtype.kind != "u":
            raise TypeError(f"{op}: codes must be unsigned integers or a format's dtype, got an array of {codes.dtype.name}")
    storage = 1 if packed else _dtypes.numpy_dtype(fmt).itemsize
    raw = _dtypes.raw_codes(codes, storage)
    if is_torch:
        raw = raw.numpy()
    return (_dtypes.unpack_fp4(raw) if packed else raw), fmt, is_torch


def _values(out: Any, torch_out: bool) -> Any:
    return sys.modules["torch"].from_numpy(out) if torch_out else out


@overload
def quantize(x: torch.Tensor, format: FormatLike, scale: float = ..., rounding: str = ..., seed: int = ...,
             saturate: bool = ..., *, raw: bool = ..., packed: bool = ...) -> torch.Tensor: ...
@overload
def quantize(x: ArrayLike, format: FormatLike, scale: float = ..., rounding: str = ..., seed: int = ...,
             saturate: bool = ..., *, raw: Literal[True], packed: bool = ...) -> RawCodes: ...
@overload
def quantize(x: ArrayLike, format: FormatLike, scale: float = ..., rounding: str = ..., seed: int = ...,
             saturate: bool = ..., *, raw: bool = ..., packed: bool = ...) -> NDArray[Any]: ...
def quantize(x: Any, format: FormatLike, scale: float = 1.0, rounding: str = "nearest", seed: int = 0,
             saturate: bool = True, *, raw: bool = False, packed: bool = False) -> Any:
    """Codes of ``encode(x * scale)`` in ``format``, in x's shape.

    x: a float array (NumPy, a CPU torch tensor, any DLPack tensor, or a list of numbers); a
    C-contiguous float32 array is read in place, other floats are converted to float32 once.
    format: a name (see ``formats()``: e4m3, e5m2, e2m1, e8m0, f16, bf16, ...), a NumPy /
    ml_dtypes dtype or a torch dtype (the module's table).
    rounding: "nearest" (ties to even), "stochastic" (element i draws counter-based bits from
    (seed, i): the same seed gives the same codes) or "toward_zero". saturate: values beyond the
    format's largest become its largest; False gives inf or NaN as a plain hardware cast does.
    raw: return bare uint8 / uint16 / uint32 codes instead of the format's dtype.
    packed: e2m1 only: two codes a byte along the last dimension (even; it halves), element 2i in
    the low nibble, as torch.float4_e2m1fn_x2 (implied by that dtype); a NumPy uint8 array (ml_dtypes
    has no packed dtype) or a torch.float4_e2m1fn_x2 tensor."""
    fmt, implied_packed = _dtypes.resolve(format, "quantize")
    packed = packed or implied_packed
    _check_packed(fmt, packed, "quantize")
    data, torch_in = _float32_input(x, "quantize")
    if packed and (len(np.shape(data)) == 0 or np.shape(data)[-1] % 2):
        raise ValueError(f"quantize: packed FP4 needs an even last dimension, got shape {tuple(np.shape(data))}")
    codes = _scalify.quantize(data, fmt, scale, rounding, seed, saturate)
    return _typed(codes, fmt, packed, torch_in, raw)


@overload
def dequantize(codes: torch.Tensor, format: Optional[FormatLike] = ..., scale: float = ..., *,
               packed: bool = ...) -> torch.Tensor: ...
@overload
def dequantize(codes: ArrayLike, format: Optional[FormatLike] = ..., scale: float = ..., *,
               packed: bool = ...) -> NDArray[np.float32]: ...
def dequantize(codes: Any, format: Optional[FormatLike] = None, scale: float = 1.0, *, packed: bool = False) -> Any:
    """float32 values ``decode(codes) * scale``, exactly: a NumPy array, or a torch tensor for torch codes.

    codes: typed codes as ``quantize`` returns them (their dtype names the format: ``format`` may be
    left out, and a different one raises TypeError) or raw unsigned codes (``format`` required).
    packed: the codes are e2m1 two a byte (implied by torch.float4_e2m1fn_x2 and by that format);
    the last dimension doubles."""
    raw, fmt, torch_in = _codes_and_format(codes, format, packed, "dequantize")
    return _values(_scalify.dequantize(raw, fmt, scale), torch_in)


def amax(x: ArrayLike) -> float:
    """The largest |x| (NaN when x holds one)."""
    data, _ = _float32_input(x, "amax")
    return float(_scalify.amax(data))


@overload
def block_quantize(x: torch.Tensor, format: FormatLike = ..., block: Tuple[int, int] = ..., rule: str = ...,
                   rounding: str = ..., seed: int = ..., *, raw: bool = ..., packed: bool = ...,
                   scale_codes: bool = ...) -> Tuple[torch.Tensor, torch.Tensor, float]: ...
@overload
def block_quantize(x: ArrayLike, format: FormatLike = ..., block: Tuple[int, int] = ..., rule: str = ...,
                   rounding: str = ..., seed: int = ..., *, raw: Literal[True], packed: bool = ...,
                   scale_codes: bool = ...) -> Tuple[RawCodes, NDArray[Any], float]: ...
@overload
def block_quantize(x: ArrayLike, format: FormatLike = ..., block: Tuple[int, int] = ..., rule: str = ...,
                   rounding: str = ..., seed: int = ..., *, raw: bool = ..., packed: bool = ...,
                   scale_codes: bool = ...) -> Tuple[NDArray[Any], NDArray[Any], float]: ...
def block_quantize(x: Any, format: FormatLike = "e4m3", block: Tuple[int, int] = (1, 32), rule: str = "mx_floor",
                   rounding: str = "nearest", seed: int = 0, *, raw: bool = False, packed: bool = False,
                   scale_codes: bool = False) -> Any:
    """Block quantisation of a 2-D float array: blocks of ``block`` = (rows, cols) share a scale
    by ``rule``: "mx_floor" (OCP MX), "mx_ceil" (never clips), "f32_amax" (amax / element max),
    "nvfp4" (E4M3 block scales under an f32 tensor scale) or "e4m3_amax".
    Returns (codes, block scales [ceil(rows/br), ceil(cols/bc)], tensor_scale):
    value = decode(code) * block scale * tensor_scale. Codes are typed as ``quantize``'s (``raw``,
    ``packed`` alike); scales are float32, or with ``scale_codes=True`` (MX rules only, whose scales
    are powers of two) E8M0 codes typed ml_dtypes.float8_e8m0fnu (torch.float8_e8m0fnu; uint8 if raw)."""
    fmt, implied_packed = _dtypes.resolve(format, "block_quantize")
    packed = packed or implied_packed
    _check_packed(fmt, packed, "block_quantize")
    data, torch_in = _float32_input(x, "block_quantize")
    if packed and len(np.shape(data)) == 2 and np.shape(data)[-1] % 2:
        raise ValueError(f"block_quantize: packed FP4 needs an even last dimension, got shape {tuple(np.shape(data))}")
    codes, scales, tensor_scale = _scalify.block_quantize(data, fmt, (block[0], block[1]), rule, rounding, seed, scale_codes)
    codes = _typed(codes, fmt, packed, torch_in, raw)
    scales = _typed(scales, "e8m0", False, torch_in, raw) if scale_codes else _values(scales, torch_in)
    return codes, scales, float(tensor_scale)


@overload
def block_dequantize(codes: torch.Tensor, scales: Any, format: Optional[FormatLike] = ...,
                     block: Tuple[int, int] = ..., rule: str = ..., tensor_scale: float = ..., *,
                     packed: bool = ...) -> torch.Tensor: ...
@overload
def block_dequantize(codes: ArrayLike, scales: ArrayLike, format: Optional[FormatLike] = ...,
                     block: Tuple[int, int] = ..., rule: str = ..., tensor_scale: float = ..., *,
                     packed: bool = ...) -> NDArray[np.float32]: ...
def block_dequantize(codes: Any, scales: Any, format: Optional[FormatLike] = None, block: Tuple[int, int] = (1, 32),
                     rule: str = "mx_floor", tensor_scale: float = 1.0, *, packed: bool = False) -> Any:
    """The float32 values of a block quantisation (the inverse of ``block_quantize``'s output).

    codes: typed or raw, as for ``dequantize`` (``format`` from typed codes' dtype when left out).
    scales: float32, or E8M0 codes (ml_dtypes.float8_e8m0fnu, torch.float8_e8m0fnu or uint8) for the
    MX rules."""
    raw, fmt, torch_in = _codes_and_format(codes, format, packed, "block_dequantize")
    scale_format, _ = _dtypes.codes_format(scales)
    scale_dtype = getattr(scales, "dtype", None)
    if scale_format == "e8m0" or str(scale_dtype) in ("uint8", "torch.uint8"):
        if not _scalify.has_e8m0_scales(rule):
            raise ValueError(f"block_dequantize: E8M0 scale codes ({scale_dtype}) go with an MX rule (mx_floor, mx_ceil), not '{rule}'")
        scale_values: Any = _scalify.dequantize(_dtypes.raw_codes(scales, 1), "e8m0", 1.0)
    elif _dtypes.is_torch(scales):
        scale_values = scales.detach().float().contiguous()
    else:
        scale_values = np.asarray(scales, dtype=np.float32)
    out = _scalify.block_dequantize(raw, scale_values, fmt, (block[0], block[1]), rule, tensor_scale)
    return _values(out, torch_in)


def formats() -> List[dict[str, Any]]:
    """Every number format: name, bits, exponent and mantissa bits, max, smallest normal and
    subnormal, and whether it has infinities and NaN."""
    return list(_scalify.formats())
