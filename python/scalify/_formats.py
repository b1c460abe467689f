"""Number formats: quantize / dequantize elementwise and block-scaled, and the formats' table."""

from __future__ import annotations

from typing import List, Tuple

from . import _scalify


def quantize(x, format: str, scale: float = 1.0, rounding: str = "nearest", seed: int = 0, saturate: bool = True):
    """Codes of ``encode(x * scale)`` in ``format`` (e4m3, e5m2, e2m1, f16, bf16, ...; see
    ``formats()``), as uint8 / uint16 / uint32 per the format's storage, in x's shape.

    rounding: "nearest" (ties to even), "stochastic" (element i draws counter-based bits from
    (seed, i): the same seed gives the same codes) or "toward_zero". saturate: values beyond the
    format's largest become its largest; False gives inf or NaN as a plain hardware cast does."""
    return _scalify.quantize(x, format, scale, rounding, seed, saturate)


def dequantize(codes, format: str, scale: float = 1.0):
    """float32 values ``decode(codes) * scale``, exactly (codes as ``quantize`` returns them)."""
    return _scalify.dequantize(codes, format, scale)


def amax(x) -> float:
    """The largest |x| (NaN when x holds one)."""
    return _scalify.amax(x)


def block_quantize(x, format: str = "e4m3", block: Tuple[int, int] = (1, 32), rule: str = "mx_floor",
                   rounding: str = "nearest", seed: int = 0):
    """Block quantisation of a 2-D float32 array: blocks of ``block`` = (rows, cols) share a scale
    by ``rule``: "mx_floor" (OCP MX), "mx_ceil" (never clips), "f32_amax" (amax / element max),
    "nvfp4" (E4M3 block scales under an f32 tensor scale) or "e4m3_amax".
    Returns (codes, block scales [ceil(rows/br), ceil(cols/bc)] as float32, tensor_scale):
    value = decode(code) * block scale * tensor_scale."""
    return _scalify.block_quantize(x, format, tuple(block), rule, rounding, seed)


def block_dequantize(codes, scales, format: str = "e4m3", block: Tuple[int, int] = (1, 32), rule: str = "mx_floor",
                     tensor_scale: float = 1.0):
    """The float32 values of a block quantisation (the inverse of ``block_quantize``'s output)."""
    return _scalify.block_dequantize(codes, scales, format, tuple(block), rule, tensor_scale)


def formats() -> List[dict]:
    """Every number format: name, bits, exponent and mantissa bits, max, smallest normal and
    subnormal, and whether it has infinities and NaN."""
    return _scalify.formats()


