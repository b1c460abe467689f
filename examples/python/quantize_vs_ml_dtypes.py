"""Quantise an array with Scalify's exact codecs and compare with ml_dtypes (and a CPU torch tensor,
without a copy, when torch is installed). Run: python examples/python/quantize_vs_ml_dtypes.py"""

import ml_dtypes
import numpy as np

import scalify

x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
for dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn):
    codes = scalify.quantize(x, dtype, saturate=False)  # typed codes: an array of that dtype
    values = scalify.dequantize(codes)  # the codes' dtype says the format
    same = np.array_equal(codes.view(np.uint8), x.astype(dtype).view(np.uint8))
    print(f"{codes.dtype}: RMS error {np.sqrt(np.mean((values - x) ** 2)):.4f}, codes equal to ml_dtypes' cast: {same}")

# NVFP4: FP4 codes packed two a byte (torch.float4_e2m1fn_x2's layout), E4M3 block scales.
x2 = x.reshape(1024, 1024)
codes, scales, tensor_scale = scalify.block_quantize(x2, "e2m1", (1, 16), "nvfp4", packed=True)
back = scalify.block_dequantize(codes, scales, "e2m1", (1, 16), "nvfp4", tensor_scale, packed=True)
print(f"nvfp4: {codes.nbytes >> 10} KiB of codes, tensor scale {tensor_scale:.3g}, RMS error {np.sqrt(np.mean((back - x2) ** 2)):.4f}")
# MXFP8: the block scales as E8M0 codes.
codes, scales, _ = scalify.block_quantize(x2, "e4m3", (1, 32), "mx_floor", scale_codes=True)
print(f"mxfp8: scales {scales.dtype}, RMS error {np.sqrt(np.mean((scalify.block_dequantize(codes, scales) - x2) ** 2)):.4f}")

try:
    import torch

    t = torch.from_numpy(x)
    print("torch tensor quantised in place of its memory:", scalify._scalify.data_pointer(t) == t.data_ptr())
    print("torch in, torch codes out:", scalify.quantize(t, torch.float8_e4m3fn).dtype)
except ImportError:
    pass
