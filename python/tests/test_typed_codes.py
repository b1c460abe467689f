"""Formats as dtypes and typed codes: every string / NumPy / ml_dtypes / torch dtype maps to its
format, codes come back typed (bit-equal to ml_dtypes' and torch's own casts), dequantize reads the
format from typed codes and refuses another one, FP4 packs as torch.float4_e2m1fn_x2, MX scales
come back as E8M0 codes, and lists are accepted. References are ml_dtypes, torch and NumPy bit ops."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import scalify

torch = pytest.importorskip("torch")

# Scalify format -> its NumPy / ml_dtypes dtype (same bits, same meaning).
NUMPY_DTYPES = {
    "f32": np.float32,
    "bf16": ml_dtypes.bfloat16,
    "f16": np.float16,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz,
    "e8m0": ml_dtypes.float8_e8m0fnu,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "int8": np.int8,
}
# Scalify format -> torch's dtype, where torch has one (float4_e2m1fn_x2 is e2m1 packed).
TORCH_DTYPES = {
    "f32": torch.float32,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "e4m3fnuz": torch.float8_e4m3fnuz,
    "e5m2fnuz": torch.float8_e5m2fnuz,
    "e8m0": torch.float8_e8m0fnu,
    "int8": torch.int8,
}


def values_in_range(fmt, n=4000, seed=0):
    """Finite values across the format's binades, none beyond its largest (positive for e8m0, and
    not below 2^-126: ml_dtypes and torch round float32 subnormals in (2^-127, 2^-126) up to
    2^-126, Scalify to the nearer power of two)."""
    rng = np.random.default_rng(seed)
    info = next(f for f in scalify.formats() if f["name"] == fmt)
    lo = -126 if fmt == "e8m0" else np.log2(info["min_subnormal"]) - 2
    x = np.exp2(rng.uniform(lo, np.log2(info["max"]), n))
    if fmt != "e8m0":
        x *= np.sign(rng.standard_normal(n))
    return x.astype(np.float32)


def test_every_scalify_format_has_a_typed_dtype():
    assert sorted(NUMPY_DTYPES) == sorted(f["name"] for f in scalify.formats())
    for fmt in NUMPY_DTYPES:
        assert scalify.quantize([1.0], fmt).dtype == np.dtype(NUMPY_DTYPES[fmt]), fmt


@pytest.mark.parametrize("fmt", sorted(NUMPY_DTYPES))
def test_each_dtype_names_its_format(fmt):
    x = np.array([0.5, -1.0, 2.0], np.float32)
    want = scalify.quantize(x, fmt, raw=True)
    dtype = NUMPY_DTYPES[fmt]
    for spelled in (dtype, np.dtype(dtype)):
        codes = scalify.quantize(x, spelled)
        assert codes.dtype == np.dtype(dtype)
        assert np.array_equal(codes.view(want.dtype), want)
    if fmt in TORCH_DTYPES:
        codes = scalify.quantize(x, TORCH_DTYPES[fmt])
        assert codes.dtype == np.dtype(dtype)  # NumPy in: NumPy codes, whatever spelled the format
        assert np.array_equal(codes.view(want.dtype), want)


@pytest.mark.parametrize("fmt", sorted(set(NUMPY_DTYPES) - {"int8"}))
def test_typed_codes_are_ml_dtypes_astype_and_round_trip(fmt):
    x = values_in_range(fmt)
    codes = scalify.quantize(x, fmt)
    want = x.astype(NUMPY_DTYPES[fmt])  # ml_dtypes' own cast (round to nearest even)
    assert codes.dtype == want.dtype
    assert np.array_equal(codes.view(f"u{want.itemsize}"), want.view(f"u{want.itemsize}"))
    assert np.array_equal(scalify.dequantize(codes), want.astype(np.float32))  # format from the dtype
    assert np.array_equal(scalify.dequantize(codes, fmt), want.astype(np.float32))


def test_int8_codes_are_numpy_int8():
    codes = scalify.quantize([1.4, -2.5, 300.0, -300.0], np.int8)
    assert codes.dtype == np.int8 and codes.tolist() == [1, -2, 127, -127]  # nearest even, symmetric ±127
    assert scalify.dequantize(codes).tolist() == [1.0, -2.0, 127.0, -127.0]


def test_raw_codes_are_todays_uints():
    x = values_in_range("e4m3", 100)
    assert scalify.quantize(x, "e4m3", raw=True).dtype == np.uint8
    assert scalify.quantize(x, "bf16", raw=True).dtype == np.uint16
    assert scalify.quantize(x, "f32", raw=True).dtype == np.uint32
    raw = scalify.quantize(x, "e4m3", raw=True)
    assert np.array_equal(raw, x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
    with pytest.raises(TypeError, match="uint8 do not say their format"):
        scalify.dequantize(raw)
    assert np.array_equal(scalify.dequantize(raw, "e4m3"), scalify.dequantize(scalify.quantize(x, "e4m3")))


def test_dequantize_refuses_codes_of_another_format():
    codes = scalify.quantize([1.0, 2.0], "e4m3")
    with pytest.raises(TypeError, match="e4m3 codes.*not e5m2"):
        scalify.dequantize(codes, "e5m2")
    with pytest.raises(TypeError, match="e4m3 codes.*not e5m2"):
        scalify.dequantize(codes, ml_dtypes.float8_e5m2)
    with pytest.raises(TypeError, match="e4m3 codes.*not e5m2"):
        scalify.dequantize(torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn), torch.float8_e5m2)
    assert scalify.dequantize(codes, "float8_e4m3fn").tolist() == [1.0, 2.0]  # an alias of the same format


def test_format_arguments_that_are_not_formats():
    with pytest.raises(ValueError, match="float8_e4m3 has no Scalify format.*e4m3=float8_e4m3fn"):
        scalify.quantize([1.0], ml_dtypes.float8_e4m3)  # IEEE-like e4m3 with inf: not OCP's e4m3fn
    with pytest.raises(ValueError, match="float64 has no Scalify format"):
        scalify.quantize([1.0], np.float64)
    with pytest.raises(ValueError, match="torch.complex64 has no Scalify format"):
        scalify.quantize([1.0], torch.complex64)
    with pytest.raises(TypeError, match="format must be a format name.*int 3"):
        scalify.quantize([1.0], 3)
    with pytest.raises(TypeError, match="format must be a format name.*NoneType"):
        scalify.quantize([1.0], None)
    with pytest.raises(TypeError, match="codes must be unsigned integers.*int64"):
        scalify.dequantize(np.array([1, 2]), "e4m3")


@pytest.mark.parametrize("fmt", sorted(TORCH_DTYPES))
def test_torch_in_torch_typed_codes_out(fmt):
    t = torch.from_numpy(values_in_range(fmt, 1000, seed=4)).reshape(20, 50)
    codes = scalify.quantize(t, fmt)
    assert isinstance(codes, torch.Tensor) and codes.dtype == TORCH_DTYPES[fmt] and codes.shape == t.shape
    if fmt != "int8":  # torch's int8 cast truncates and wraps: not a rounding quantiser
        # torch's own cast, where its semantics are Scalify's: finite values within the range,
        # round to nearest even. (Beyond the range torch 2.x saturates e4m3fn, gives inf/NaN for
        # e5m2 and the fnuz formats, and drops e8m0's sign; e5m2's NaN is 0x7F in torch, 0x7E here.)
        want = t.to(TORCH_DTYPES[fmt])
        assert torch.equal(codes.view(torch.uint8 if codes.element_size() == 1 else torch.int16),
                           want.view(torch.uint8 if want.element_size() == 1 else torch.int16))
    back = scalify.dequantize(codes)
    assert isinstance(back, torch.Tensor) and back.dtype == torch.float32
    assert torch.equal(back, codes.float())


def test_torch_codes_without_a_torch_dtype_are_uint8():
    t = torch.tensor([0.5, -7.0, 3.0])
    codes = scalify.quantize(t, "e2m3")  # torch has no FP6 dtype: raw uint8 codes, format needed back
    assert codes.dtype == torch.uint8
    assert codes.tolist() == np.array([0.5, -7.0, 3.0], np.float32).astype(ml_dtypes.float6_e2m3fn).view(np.uint8).tolist()
    assert scalify.dequantize(codes, "e2m3").tolist() == [0.5, -7.0, 3.0]
    with pytest.raises(TypeError, match="do not say their format"):
        scalify.dequantize(codes)


def test_typed_codes_are_a_view_of_the_codes():
    codes = scalify.quantize(np.ones(64, np.float32), "e4m3")
    assert codes.base is not None and codes.ctypes.data == codes.view(np.uint8).ctypes.data
    t = scalify.quantize(torch.ones(64), "e4m3")
    assert t.view(torch.uint8).data_ptr() == t.data_ptr()


def fp4_pack_reference(x):
    """ml_dtypes' FP4 codes, packed by hand: element 2i in the low nibble, 2i+1 in the high one."""
    codes = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def test_packed_fp4_is_torchs_float4_e2m1fn_x2_layout():
    x = values_in_range("e2m1", 24 * 64, seed=5).reshape(24, 64)
    packed = scalify.quantize(x, "e2m1", packed=True)
    assert packed.dtype == np.uint8 and packed.shape == (24, 32)
    assert np.array_equal(packed, fp4_pack_reference(x))
    want = x.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(scalify.dequantize(packed, "e2m1", packed=True), want)
    # torch: its packed dtype implies the layout, in and out
    t = scalify.quantize(torch.from_numpy(x), torch.float4_e2m1fn_x2)
    assert t.dtype == torch.float4_e2m1fn_x2 and t.shape == (24, 32)
    assert np.array_equal(t.view(torch.uint8).numpy(), fp4_pack_reference(x))
    assert torch.equal(scalify.dequantize(t), torch.from_numpy(want))
    assert torch.equal(scalify.quantize(torch.from_numpy(x), "e2m1", packed=True).view(torch.uint8), t.view(torch.uint8))


def test_packed_fp4_refusals():
    with pytest.raises(ValueError, match="even last dimension.*\\(2, 3\\)"):
        scalify.quantize(np.zeros((2, 3), np.float32), "e2m1", packed=True)
    with pytest.raises(ValueError, match="packed=True is for e2m1.*e4m3"):
        scalify.quantize(np.zeros(4, np.float32), "e4m3", packed=True)
    with pytest.raises(ValueError, match="one code a byte"):
        scalify.dequantize(scalify.quantize(np.zeros(4, np.float32), "e2m1"), packed=True)


def test_packed_block_quantisation():
    x = np.random.default_rng(6).standard_normal((16, 64)).astype(np.float32)
    codes, scales, ts = scalify.block_quantize(x, "e2m1", (1, 16), "nvfp4", raw=True)
    packed, scales2, ts2 = scalify.block_quantize(x, "e2m1", (1, 16), "nvfp4", packed=True)
    assert np.array_equal(scales, scales2) and ts == ts2
    by_hand = (codes[:, 0::2] & 0xF) | (codes[:, 1::2] << 4)
    assert packed.shape == (16, 32) and np.array_equal(packed, by_hand)
    want = scalify.block_dequantize(codes, scales, "e2m1", (1, 16), "nvfp4", ts)
    assert np.array_equal(scalify.block_dequantize(packed, scales, "e2m1", (1, 16), "nvfp4", ts, packed=True), want)


def test_mx_scales_as_e8m0_codes():
    x = np.random.default_rng(7).standard_normal((8, 96)).astype(np.float32)
    x[0, :32] = 0  # a block of zeros: scale 2^-127, E8M0's smallest
    x[1, 40] = np.nan  # a NaN block: NaN scale
    x[2, :32] *= 1e30
    for rule in ("mx_floor", "mx_ceil"):
        codes, scales, _ = scalify.block_quantize(x, "e4m3", (1, 32), rule)
        codes2, e8m0, _ = scalify.block_quantize(x, "e4m3", (1, 32), rule, scale_codes=True)
        assert e8m0.dtype == ml_dtypes.float8_e8m0fnu and e8m0.shape == scales.shape
        assert np.array_equal(e8m0.view(np.uint8), scales.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))
        assert np.array_equal(codes2, codes)
        want = scalify.block_dequantize(codes, scales, "e4m3", (1, 32), rule)
        for given in (e8m0, e8m0.view(np.uint8)):  # typed or raw E8M0 codes
            assert np.array_equal(scalify.block_dequantize(codes, given, None, (1, 32), rule), want, equal_nan=True)
    _, t_scales, _ = scalify.block_quantize(torch.from_numpy(x), "e4m3", scale_codes=True)  # mx_floor
    assert t_scales.dtype == torch.float8_e8m0fnu
    mx_floor_scales = scalify.block_quantize(x, "e4m3")[1]
    assert np.array_equal(t_scales.view(torch.uint8).numpy(), mx_floor_scales.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))
    with pytest.raises(ValueError, match="E8M0 scale codes need an MX rule.*nvfp4"):
        scalify.block_quantize(x, "e2m1", (1, 16), "nvfp4", scale_codes=True)
    with pytest.raises(ValueError, match="E8M0 scale codes.*not 'nvfp4'"):
        scalify.block_dequantize(codes, e8m0, "e4m3", (1, 32), "nvfp4")


def test_lists_and_non_float_inputs():
    assert scalify.quantize([1.0, 2.0, 500.0], "e4m3").tolist() == [1.0, 2.0, 448.0]
    assert scalify.quantize([[1, 2], [3, 4]], "e5m2").shape == (2, 2)
    assert scalify.dequantize(scalify.quantize((0.5, 6.5), "e2m1")).tolist() == [0.5, 6.0]
    assert scalify.amax([1.0, -3.0]) == 3.0
    codes, _, _ = scalify.block_quantize([[1.0] * 32, [2.0] * 32], "e4m3")
    assert codes.shape == (2, 32)
    with pytest.raises(TypeError, match="must hold floats.*int64"):
        scalify.quantize(np.arange(4), "e4m3")
    with pytest.raises(TypeError, match="must hold floats.*torch.int32"):
        scalify.quantize(torch.arange(4, dtype=torch.int32), "e4m3")
    with pytest.raises(TypeError, match="sequence of numbers"):
        scalify.quantize(["a", "b"], "e4m3")
    # other float dtypes convert once; C-contiguous float32 stays read in place (test_formats)
    assert np.array_equal(scalify.quantize(np.float64([1, 2]), "e4m3"), scalify.quantize([1, 2], "e4m3"))
    assert np.array_equal(scalify.quantize(np.float16([1, 2]), ml_dtypes.float8_e5m2).view(np.uint8), [60, 64])


def test_import_scalify_does_not_import_torch():
    code = "import sys, scalify; scalify.quantize([1.0], 'e4m3'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_torch_raw_codes_of_another_width_are_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="2 byte"):
        scalify.dequantize(torch.tensor([56, 60], dtype=torch.uint8), "bf16")  # two bytes read as one bf16 code before
