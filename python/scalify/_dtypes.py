"""Formats as dtypes: each Scalify format's NumPy / ml_dtypes dtype and torch dtype, the one table
that turns a format given as a string or a dtype into its name, and typed codes back into raw ones.

torch is never imported here: its dtypes and tensors are recognised by their type's module, and
torch is only used on objects that came from it (so it is already loaded)."""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple

import ml_dtypes
import numpy as np

from . import _scalify

# Scalify format -> (its NumPy dtype: ml_dtypes' for the low-precision floats, whose codes have the
# same bits and meaning; the torch dtype's name, or None where torch has none). e2m1 has no
# one-code-per-byte torch dtype: its packed two-per-byte layout is torch.float4_e2m1fn_x2.
FORMAT_DTYPES: Dict[str, Tuple[np.dtype[Any], Optional[str]]] = {
    "f32": (np.dtype(np.float32), "float32"),
    "bf16": (np.dtype(ml_dtypes.bfloat16), "bfloat16"),
    "f16": (np.dtype(np.float16), "float16"),
    "e4m3": (np.dtype(ml_dtypes.float8_e4m3fn), "float8_e4m3fn"),
    "e5m2": (np.dtype(ml_dtypes.float8_e5m2), "float8_e5m2"),
    "e4m3fnuz": (np.dtype(ml_dtypes.float8_e4m3fnuz), "float8_e4m3fnuz"),
    "e5m2fnuz": (np.dtype(ml_dtypes.float8_e5m2fnuz), "float8_e5m2fnuz"),
    "e4m3b11fnuz": (np.dtype(ml_dtypes.float8_e4m3b11fnuz), None),
    "e8m0": (np.dtype(ml_dtypes.float8_e8m0fnu), "float8_e8m0fnu"),
    "e2m3": (np.dtype(ml_dtypes.float6_e2m3fn), None),
    "e3m2": (np.dtype(ml_dtypes.float6_e3m2fn), None),
    "e2m1": (np.dtype(ml_dtypes.float4_e2m1fn), None),
    "int8": (np.dtype(np.int8), "int8"),  # symmetric ±127, two's complement codes
}
PACKED_FP4_TORCH = "float4_e2m1fn_x2"  # two e2m1 codes per byte (pack_fp4)
_FORMAT_OF_NUMPY = {dtype: name for name, (dtype, _) in FORMAT_DTYPES.items()}
_FORMAT_OF_TORCH = {torch_name: name for name, (_, torch_name) in FORMAT_DTYPES.items() if torch_name}
_RAW_CODES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32)}


def is_torch(obj: object) -> bool:
    """Whether obj is a torch object (tensor, dtype): by its type's module, without importing torch."""
    return type(obj).__module__.split(".")[0] == "torch"


def supported() -> str:
    """The accepted formats and dtypes, for error messages."""
    numpy_names = ", ".join(f"{name}={dtype.name}" for name, (dtype, _) in FORMAT_DTYPES.items())
    torch_names = ", ".join(f"torch.{t}" for t in [*_FORMAT_OF_TORCH, PACKED_FP4_TORCH])
    return f"formats and their NumPy/ml_dtypes dtypes: {numpy_names}; torch dtypes: {torch_names}"


def resolve(format: object, what: str = "format") -> Tuple[str, bool]:
    """(Scalify format name, whether the dtype implies FP4's packed layout) of a format given as a
    name, a NumPy / ml_dtypes dtype or a torch dtype."""
    if isinstance(format, str):
        return _scalify.format_name(format), False
    if is_torch(format) and type(format).__name__ == "dtype":
        name = str(format).removeprefix("torch.")
        if name == PACKED_FP4_TORCH:
            return "e2m1", True
        if name in _FORMAT_OF_TORCH:
            return _FORMAT_OF_TORCH[name], False
        raise ValueError(f"{what}: {format} has no Scalify format; {supported()}")
    try:
        if format is None:  # np.dtype(None) would be float64
            raise TypeError
        dtype = np.dtype(format)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            f"{what}: format must be a format name, a NumPy/ml_dtypes dtype or a torch dtype, got {type(format).__name__} {format!r}"
        ) from None
    if dtype in _FORMAT_OF_NUMPY:
        return _FORMAT_OF_NUMPY[dtype], False
    raise ValueError(f"{what}: dtype {dtype.name} has no Scalify format; {supported()}")


def numpy_dtype(format_name: str) -> np.dtype[Any]:
    return FORMAT_DTYPES[format_name][0]


def torch_dtype(format_name: str, packed: bool) -> Any:
    """torch's dtype for the codes of format_name (None where torch has none)."""
    torch = sys.modules["torch"]
    name = PACKED_FP4_TORCH if packed else FORMAT_DTYPES[format_name][1]
    return getattr(torch, name) if name else None


def codes_format(codes: object) -> Tuple[Optional[str], bool]:
    """(format, packed) that typed codes carry in their dtype; (None, False) for raw uint codes."""
    dtype = getattr(codes, "dtype", None)
    if is_torch(codes):
        name = str(dtype).removeprefix("torch.")
        if name == PACKED_FP4_TORCH:
            return "e2m1", True
        return _FORMAT_OF_TORCH.get(name), False
    if isinstance(dtype, np.dtype):
        return _FORMAT_OF_NUMPY.get(dtype), False
    return None, False


def raw_codes(codes: Any, storage_bytes: int) -> Any:
    """The codes' bits as unsigned integers of storage_bytes each (a view, no copy)."""
    raw = _RAW_CODES[storage_bytes]
    if is_torch(codes):
        torch = sys.modules["torch"]
        if codes.element_size() != storage_bytes:
            raise ValueError(f"codes of this format take {storage_bytes} byte(s) each, got {codes.dtype} "
                             f"({codes.element_size()} byte(s))")
        return codes.detach().contiguous().view(getattr(torch, f"uint{8 * storage_bytes}"))
    codes = np.asarray(codes)
    return codes if codes.dtype.kind == "u" else codes.view(raw)


# FP4's packed layout, as torch.float4_e2m1fn_x2 (PyTorch's torch/headeronly/util/Float4_e2m1fn_x2.h:
# "val1 : val0 = bits 7654 : 3210"), torchao (prototype/mx_formats: `uint8_data[::2] |
# uint8_data[1::2] << 4`) and TransformerEngine store it: along the last dimension, element 2i in
# the low nibble of byte i, element 2i+1 in the high nibble.
def pack_fp4(codes: np.ndarray[Any, np.dtype[np.uint8]]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"packed FP4 holds two codes per byte along the last dimension, which must be even; got shape {codes.shape}")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8, copy=False)


def unpack_fp4(packed: np.ndarray[Any, np.dtype[np.uint8]]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    if packed.ndim == 0:
        raise ValueError("packed FP4 codes need at least one dimension")
    codes = np.empty((*packed.shape[:-1], 2 * packed.shape[-1]), np.uint8)
    codes[..., 0::2] = packed & 0xF
    codes[..., 1::2] = packed >> 4
    return codes
