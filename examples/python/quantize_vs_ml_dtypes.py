"""Quantise an array with Scalify's exact codecs and compare with ml_dtypes (and a CPU torch tensor,
without a copy, when torch is installed). Run: python examples/python/quantize_vs_ml_dtypes.py"""

import numpy as np

import scalify

x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
for fmt, ml_name in [("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2"), ("e2m1", "float4_e2m1fn")]:
    codes = scalify.quantize(x, fmt, saturate=False)
    values = scalify.dequantize(codes, fmt)
    line = f"{fmt}: RMS error {np.sqrt(np.mean((values - x) ** 2)):.4f}"
    try:
        import ml_dtypes

        same = np.array_equal(codes, x.astype(getattr(ml_dtypes, ml_name)).view(np.uint8))
        line += f", codes equal to ml_dtypes' {ml_name}: {same}"
    except ImportError:
        pass
    print(line)

codes, scales, tensor_scale = scalify.block_quantize(x.reshape(1024, 1024), "e2m1", (1, 16), "nvfp4")
back = scalify.block_dequantize(codes, scales, "e2m1", (1, 16), "nvfp4", tensor_scale)
print(f"nvfp4: tensor scale {tensor_scale:.3g}, RMS error {np.sqrt(np.mean((back - x.reshape(1024, 1024)) ** 2)):.4f}")

try:
    import torch

    t = torch.from_numpy(x)
    print("torch tensor quantised in place of its memory:", scalify._scalify.data_pointer(t) == t.data_ptr())
except ImportError:
    pass
