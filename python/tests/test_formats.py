"""Formats from Python, bit for bit against ml_dtypes (an independent implementation) on random
inputs, and the block quantisers' round trip."""

import ml_dtypes
import numpy as np
import pytest

import scalify

# Scalify's name -> ml_dtypes' type, for the formats ml_dtypes has.
ML_DTYPES = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "bf16": ml_dtypes.bfloat16,
    "f16": np.float16,
}


def random_inputs(fmt, n=20000, seed=0):
    """Values across the format's range (every binade, with sign), none beyond its largest."""
    rng = np.random.default_rng(seed)
    info = next(f for f in scalify.formats() if f["name"] == fmt)
    lo, hi = np.log2(info["min_subnormal"]) - 2, np.log2(info["max"])
    x = np.sign(rng.standard_normal(n)) * np.exp2(rng.uniform(lo, hi, n))
    return x.astype(np.float32)


@pytest.mark.parametrize("fmt", sorted(ML_DTYPES))
def test_codes_match_ml_dtypes(fmt):
    x = random_inputs(fmt)
    want = x.astype(ML_DTYPES[fmt])
    codes = scalify.quantize(x, fmt, saturate=False)
    assert codes.shape == x.shape
    assert np.array_equal(codes, want.view(codes.dtype)), fmt
    back = scalify.dequantize(codes, fmt)
    assert np.array_equal(back, want.astype(np.float32)), fmt


def test_scale_and_saturation():
    x = np.array([1.0, 500.0, -1e6], dtype=np.float32)
    assert np.array_equal(scalify.dequantize(scalify.quantize(x, "e4m3"), "e4m3"), [1.0, 448.0, -448.0])
    codes = scalify.quantize(x, "e4m3", scale=0.5)  # encode(x * 0.5)
    assert np.array_equal(scalify.dequantize(codes, "e4m3", scale=2.0), [1.0, 512.0, -896.0])  # 250 rounds to 256


def test_stochastic_rounding_is_unbiased_and_seeded():
    x = np.full(100000, 1.1, dtype=np.float32)  # between e4m3's 1.0 and 1.125
    a = scalify.quantize(x, "e4m3", rounding="stochastic", seed=3)
    assert np.array_equal(a, scalify.quantize(x, "e4m3", rounding="stochastic", seed=3))
    assert not np.array_equal(a, scalify.quantize(x, "e4m3", rounding="stochastic", seed=4))
    mean = scalify.dequantize(a, "e4m3").mean()
    assert abs(mean - 1.1) < 4 * 0.0625 / np.sqrt(x.size)  # 4 standard deviations of the mean


def test_amax_and_format_table():
    assert scalify.amax(np.array([1, -7.5, 3], dtype=np.float32)) == 7.5
    names = [f["name"] for f in scalify.formats()]
    assert {"e4m3", "e5m2", "e2m1", "e8m0", "bf16"} <= set(names)
    e4m3 = next(f for f in scalify.formats() if f["name"] == "e4m3")
    assert (e4m3["max"], e4m3["min_normal"], e4m3["min_subnormal"]) == (448.0, 2.0**-6, 2.0**-9)


def test_block_quantisation_round_trip():
    x = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    for block, rule in (((1, 32), "mx_floor"), ((1, 16), "nvfp4"), ((16, 16), "nvfp4")):
        codes, scales, ts = scalify.block_quantize(x, "e2m1", block, rule)
        assert codes.dtype == ml_dtypes.float4_e2m1fn and codes.shape == x.shape
        assert scales.shape == (32 // block[0], 64 // block[1])
        back = scalify.block_dequantize(codes, scales, "e2m1", block, rule, ts)
        # FP4 keeps 2 significant bits: each value within half a step of its block's grid.
        assert np.max(np.abs(back - x)) <= np.max(np.abs(x)) / 2
        assert np.corrcoef(back.ravel(), x.ravel())[0, 1] > 0.95
    assert ts != 1.0  # nvfp4's tensor scale


def test_bad_arguments_are_value_errors_naming_them():
    with pytest.raises(ValueError, match="fp9"):
        scalify.quantize(np.zeros(3, np.float32), "fp9")
    with pytest.raises(ValueError, match="rounding must be"):
        scalify.quantize(np.zeros(3, np.float32), "e4m3", rounding="up")
    with pytest.raises(ValueError, match="1 byte"):
        scalify.dequantize(np.zeros(3, np.uint16), "e4m3")
    with pytest.raises(ValueError, match="2-D"):
        scalify.block_quantize(np.zeros(8, np.float32))


def test_arrays_cross_without_a_copy():
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    assert scalify._scalify.data_pointer(x) == x.ctypes.data  # NumPy: the buffer itself
    strided = np.random.default_rng(3).standard_normal(2000).astype(np.float32)[::2]
    assert scalify._scalify.data_pointer(strided) != strided.ctypes.data  # not contiguous: converted
    assert np.array_equal(scalify.quantize(strided, "e4m3"), scalify.quantize(strided.copy(), "e4m3"))
    import torch  # a DLPack tensor: the same memory (scripts/test_python.sh installs CPU torch)

    t = torch.randn(1000)
    assert scalify._scalify.data_pointer(t) == t.data_ptr()
    codes = scalify.quantize(t, "e5m2")  # torch in, torch codes out
    assert np.array_equal(codes.view(torch.uint8).numpy(), scalify.quantize(t.numpy(), "e5m2", raw=True))
