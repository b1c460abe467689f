"""Peers: torchao's float8 and MX training emulation against Scalify's definitions, on the references
tests/data/torch_peers/make_reference.py generated once (torchao 0.18.0, torch 2.15.0; torchao is
never installed here). Scalify's side is re-implemented from scalify.quantize / block_quantize and
NumPy (scalify.torch is a later piece; its tests reuse load_reference() and TORCHAO_RECIPES).

Which Scalify recipe has torchao's definition (TORCHAO_RECIPES; docs/PEERS_TORCHAO.md):
  f8       Float8Linear(emulate=True), tensorwise dynamic           = preset "current"
  f8pow2   the same, round_scales_to_power_of_2=True                = "fp8_amax" with gradient margin 0
  mxfloor  MXFP8Linear(EMULATED, FLOOR): e4m3 for all three operands = "mxfp8" with an e4m3 gradient
  mxrceil  MXFP8Linear(EMULATED, RCEIL), its default mode           = the same with block_scale mx_ceil

What is exact: every quantised operand of the three GEMMs (codes and scales, bit for bit), and the
decoded MX operands. What is bounded, not guessed: torchao runs its GEMMs as an f32 torch.mm (an
unspecified summation order, maybe FMA), then adds the bias in f32. Against the same operands
multiplied in float64 its result y obeys (Higham, Accuracy and Stability, Lemma 3.3 / Eq. 3.5, any
order): |y - (A.B + bias)| <= gamma32(K + 1) (|A|.|B| + |bias|), gamma(n) = n u / (1 - n u), u = 2^-24,
K the reduction length (96, 128, 64), plus the float64 reference's own gamma64(K) |A|.|B|.
Where the definitions differ the tests name the elements and the reason:
  - f8: torchao decodes each operand as code / scale (one f32 division per element); Scalify runs the
    GEMM on the codes with alpha = (1/s_a)(1/s_b) in f32 (three roundings). Same codes, same scales;
    the outputs differ by at most (gamma32(2) + gamma32(3)) |A|.|B| beyond the accumulation bound.
  - an all-zero tensor: torchao's scale is 448 / 1e-12 (its amax clamp), Scalify keeps 1 (codes 0 both).
  - f8pow2: torchao rounds the f32 scale down to a power of two with an f32 log2, which rounds a
    448 / amax just below 2^k up to k: one power of two above Scalify's floor(log2(448 / amax)).
  - MX blocks whose E8M0 byte is 0, 2^-127 (FLOOR: amax < 2^-118; RCEIL: amax <= 448 * 2^-127):
    FLOOR divides by 2^-126 (torchao clamps the f32 scale to the smallest normal) but stores 2^-127,
    so its codes are those of x * 2^126 and decode to about half of x; RCEIL multiplies by 1 (its
    exponent-0 case). Scalify divides by 2^-127 exactly.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import scalify

REFERENCE = Path(__file__).resolve().parents[2] / "tests" / "data" / "torch_peers" / "reference.npz"
U32, U64 = 2.0**-24, 2.0**-53
E4M3_MAX, E5M2_MAX = 448.0, 57344.0

# The operands torchao casts, in its order (make_reference.py), as functions of (x, w, go), and the
# element format of each; then the GEMMs as (name, reference key, operand a, operand b): out = a @ b.
F8_OPERANDS = [lambda x, w, g: x, lambda x, w, g: w.T, lambda x, w, g: g,
               lambda x, w, g: w.T, lambda x, w, g: g, lambda x, w, g: x]
F8_FORMATS = ["e4m3", "e4m3", "e5m2", "e4m3", "e5m2", "e4m3"]
MX_OPERANDS = [lambda x, w, g: x, lambda x, w, g: w, lambda x, w, g: g,
               lambda x, w, g: w.T, lambda x, w, g: g.T, lambda x, w, g: x.T]


def _f8_gemms(v):  # v[i]: operand i decoded (torch orientation of its cast)
    return [("y", v[0] @ v[1]), ("dx", v[2] @ v[3].T), ("dw", (v[4].T @ v[5]))]


def _mx_gemms(v):  # blocks along each reduction: x, w along K; g, w^T along N; g^T, x^T along tokens
    return [("y", v[0] @ v[1].T), ("dx", v[2] @ v[3].T), ("dw", v[4] @ v[5].T)]


def load_reference():
    """The committed torchao references: a dict of NumPy arrays, "meta" a dict (torch, torchao, numpy
    versions). Inputs "x" [64, 96], "w" [128, 96] (out x in, torch layout), "b" [128], "go" [64, 128];
    for cfg in TORCHAO_RECIPES: "cfg/y", "cfg/dx", "cfg/dw" (f32), "cfg/op{i}/codes" (uint8 FP8 bits, in
    the shape of the cast tensor: F8_OPERANDS / MX_OPERANDS) and "cfg/op{i}/scale" (f8: the f32 encode
    scale; MX: biased E8M0 bytes, one per 32 elements along the last dim). Edge cases under "edge/"."""
    with np.load(REFERENCE, allow_pickle=False) as d:
        ref = {k: d[k] for k in d.files}
    ref["meta"] = json.loads(str(ref["meta"]))
    for i, op in enumerate(F8_OPERANDS):
        shape = op(ref["x"], ref["w"], ref["go"]).shape
        for cfg in ("f8", "f8pow2"):
            ref[f"{cfg}/op{i}/codes"] = ref[f"{cfg}/op{i}/codes"].reshape(shape)
    for i, op in enumerate(MX_OPERANDS):
        shape = op(ref["x"], ref["w"], ref["go"]).shape
        for cfg in ("mxfloor", "mxrceil"):
            ref[f"{cfg}/op{i}/codes"] = ref[f"{cfg}/op{i}/codes"].reshape(shape)
            ref[f"{cfg}/op{i}/scale"] = ref[f"{cfg}/op{i}/scale"].reshape(shape[0], shape[1] // 32)
    return ref


def _recipe_json(preset, roles=None):
    j = json.loads(scalify.preset(preset).to_json())
    for role, changes in (roles or {}).items():
        j["linear"][role].update(changes)
    j["name"] = preset + "_torchao"
    return json.dumps(j)


# The Scalify recipe with each torchao configuration's definition (docs/PEERS_TORCHAO.md).
TORCHAO_RECIPES = {
    "f8": lambda: scalify.preset("current"),
    "f8pow2": lambda: scalify.Recipe.from_json(_recipe_json("fp8_amax", {"gradient": {"margin": 0}})),
    "mxfloor": lambda: scalify.Recipe.from_json(_recipe_json(
        "mxfp8", {"gradient": {"format": "e4m3", "block_scale": "mx_floor"},
                  "activation": {"block_scale": "mx_floor"}, "weight": {"block_scale": "mx_floor"}})),
    "mxrceil": lambda: scalify.Recipe.from_json(_recipe_json(
        "mxfp8", {"gradient": {"format": "e4m3", "block_scale": "mx_ceil"},
                  "activation": {"block_scale": "mx_ceil"}, "weight": {"block_scale": "mx_ceil"}})),
}


@pytest.fixture(scope="module")
def ref():
    return load_reference()


def gamma(n, u):
    return n * u / (1 - n * u)


def gemm_bound(a, b, bias=None):
    """A bound on |fl32(a @ b (+ bias)) - (a @ b (+ bias))| for any f32 summation order, plus the float64
    reference's own error; |a| @ |b| is computed in float64 and inflated by its own relative error."""
    k = a.shape[1]
    s = (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) * (1 + gamma(k, U64))
    if bias is not None:
        s = s + np.abs(bias.astype(np.float64))
    return (gamma(k + 1, U32) + gamma(k, U64)) * s, k


def f64(a):
    return np.asarray(a, dtype=np.float64)


def is_pow2(s):
    m, _ = np.frexp(np.float64(s))
    return m == 0.5


def test_reference_versions(ref):
    assert ref["meta"]["torchao"] == "0.18.0" and ref["meta"]["torch"].startswith("2.15.0")


def test_recipes_have_torchao_definitions():
    """The recipes TORCHAO_RECIPES names parse, and each role has torchao's format and scale rule."""
    want = {"f8": ("current", "e4m3", "e5m2", None), "f8pow2": ("amax_bias", "e4m3", "e5m2", None),
            "mxfloor": ("mx", "e4m3", "e4m3", "mx_floor"), "mxrceil": ("mx", "e4m3", "e4m3", "mx_ceil")}
    for cfg, make in TORCHAO_RECIPES.items():
        lin = make().linear
        scaling, fmt, gfmt, rule = want[cfg]
        roles = [(lin.forward.activation, fmt), (lin.forward.weight, fmt), (lin.input_grad.gradient, gfmt),
                 (lin.input_grad.weight, fmt), (lin.weight_grad.activation, fmt), (lin.weight_grad.gradient, gfmt)]
        for q, f in roles:
            got = (q.scaling, q.format, q.margin, q.saturate, q.rounding, q.transform)
            assert got == (scaling, f, 0, True, "nearest", "none"), cfg
            if rule:
                assert q.block_scale == rule, cfg


# ---- per-tensor (Float8Linear, tensorwise) ----------------------------------------------------------


def scalify_current_scale(a, fmax):
    """Scalify's current scaling (src/scalify/quant/quantizer.cpp, scale_from_amax, margin 0): the encode
    scale fmax / amax in double, rounded to f32, within [2^-126, 2^127]; 1 when amax is 0."""
    amax = float(np.max(np.abs(a)))
    if not amax > 0:
        return np.float32(1.0)
    return np.float32(min(max(fmax / amax, 2.0**-126), 2.0**127))


def scalify_amax_bias_scale(a, fmax):
    """Scalify's amax_bias scaling (fp8_amax): 2^b, b = floor(log2(fmax / amax)) in double, in [-126, 127]."""
    amax = float(np.max(np.abs(a)))
    b = int(np.floor(np.log2(fmax / amax))) if amax > 0 else 0
    return np.float32(2.0 ** min(max(b, -126), 127))


@pytest.mark.parametrize("cfg", ["f8", "f8pow2"])
def test_float8_tensorwise_codes_and_scales_exact(ref, cfg):
    """Every cast of the three GEMMs: the same encode scale and the same FP8 codes, bit for bit (both
    multiply x * scale in f32, then round to nearest even, saturating at the format's largest)."""
    rule = scalify_current_scale if cfg == "f8" else scalify_amax_bias_scale
    for i, op in enumerate(F8_OPERANDS):
        a = np.ascontiguousarray(op(ref["x"], ref["w"], ref["go"]), dtype=np.float32)
        fmt = F8_FORMATS[i]
        s = rule(a, E4M3_MAX if fmt == "e4m3" else E5M2_MAX)
        assert ref[f"{cfg}/op{i}/scale"][0] == s, (cfg, i)
        codes = np.asarray(scalify.quantize(a, fmt, float(s), raw=True))
        np.testing.assert_array_equal(codes, ref[f"{cfg}/op{i}/codes"], err_msg=f"{cfg} operand {i}")
    if cfg == "f8":  # the data exercises saturation-free casts at non-power-of-two scales
        assert not is_pow2(ref["f8/op0/scale"][0])


def _f8_decoded(ref, cfg, scalify_def):
    """Operand values: torchao's emulation fl32(code / scale); Scalify's definition the codes' values
    (its GEMM runs on them) with alpha = fl32(fl32(1/s_a) fl32(1/s_b)) applied to the product."""
    vals, inv = [], []
    for i in range(6):
        c = np.asarray(scalify.dequantize(ref[f"{cfg}/op{i}/codes"], F8_FORMATS[i]))  # exact code values
        s = ref[f"{cfg}/op{i}/scale"][0]
        vals.append(c if scalify_def else (c / s).astype(np.float32))  # float32 / float32: one rounding
        inv.append(np.float32(np.float32(1.0) / s))
    return vals, inv


@pytest.mark.parametrize("cfg", ["f8", "f8pow2"])
def test_float8_tensorwise_gemms(ref, cfg):
    """torchao's outputs are its definition to the f32 accumulation bound; Scalify's definition differs
    from it by no more than the decode rule's named difference (zero for power-of-two scales)."""
    tv, _ = _f8_decoded(ref, cfg, scalify_def=False)
    sv, inv = _f8_decoded(ref, cfg, scalify_def=True)
    alphas = [np.float32(inv[0] * inv[1]), np.float32(inv[2] * inv[3]), np.float32(inv[4] * inv[5])]
    pow2 = all(is_pow2(ref[f"{cfg}/op{i}/scale"][0]) for i in range(6))
    torchao_gemms = _f8_gemms([f64(v) for v in tv])
    scalify_gemms = _f8_gemms([f64(v) for v in sv])  # on the codes' values, alpha below
    for (name, t_exact), (_, s_codes), alpha in zip(torchao_gemms, scalify_gemms, alphas):
        got = f64(ref[f"{cfg}/{name}"])
        a_b = {"y": (tv[0], tv[1]), "dx": (tv[2], tv[3].T), "dw": (tv[4].T, tv[5])}[name]
        bias = f64(ref["b"]) if name == "y" else 0.0
        tol, _ = gemm_bound(*a_b, ref["b"] if name == "y" else None)
        t_def = t_exact + bias
        err = np.abs(got - t_def)
        assert np.all(err <= tol), (cfg, name, float(np.max(err / tol)))
        # Scalify's definition: codes GEMM (exact here in float64) times alpha, + bias in f32.
        s_def = s_codes * float(alpha) + bias
        s_abs = np.abs(f64(a_b[0])) @ np.abs(f64(a_b[1]))
        decode = 0.0 if pow2 else (gamma(2, U32) + gamma(3, U32)) * s_abs * (1 + gamma(3, U32))
        assert np.all(np.abs(got - s_def) <= tol + decode), (cfg, name)
        if pow2:  # power-of-two scales: the two definitions are the same numbers
            np.testing.assert_array_equal(s_def, t_def)
    if cfg == "f8":
        # the decode difference is real: division by s vs multiplication by fl32(1/s) differ somewhere
        c0 = np.asarray(scalify.dequantize(ref["f8/op0/codes"], "e4m3"))
        assert np.any((c0 / ref["f8/op0/scale"][0]).astype(np.float32) != (c0 * inv[0]).astype(np.float32))


def test_float8_zero_tensor_scale(ref):
    """An all-zero tensor: torchao's scale is 448 / 1e-12 (its EPS clamp on amax, float8_utils.py), Scalify
    keeps the scale it had (1 for current scaling). Both cast every element to code 0."""
    assert ref["edge/f8_zero_scale"][0] == np.float32(448.0 / 1e-12)
    assert scalify_current_scale(np.zeros((4, 4), np.float32), E4M3_MAX) == 1.0
    for s in (1.0, float(ref["edge/f8_zero_scale"][0])):
        assert not np.any(np.asarray(scalify.quantize(np.zeros((4, 4), np.float32), "e4m3", s, raw=True)))


def test_float8_pow2_scale_rounding_edge(ref):
    """round_scales_to_power_of_2: torchao takes exp2(floor(log2(s))) of the f32 scale s = fl32(448 / amax)
    with an f32 log2. amax one ulp above 3.5 gives s = 128 (1 - 2^-24), whose f32 log2 rounds to 7:
    torchao's scale is 128, Scalify's (double) floor(log2(448 / amax)) gives 64. With 128 the amax
    element lands just above 448 and saturates; Scalify's 64 keeps it in range."""
    x = ref["edge/f8pow2_near_x"]
    amax = float(np.max(np.abs(x)))
    assert amax == np.nextafter(np.float32(3.5), np.float32(4.0))
    s = np.float32(448.0 / amax)
    assert s < 128 and ref["edge/f8pow2_near_scale"][0] == 128.0
    assert scalify_amax_bias_scale(x, E4M3_MAX) == 64.0
    assert np.float32(amax) * np.float32(128.0) > 448.0  # clipped by torchao's scale


# ---- MX (MXFP8Linear, emulated) ---------------------------------------------------------------------


def scalify_mx(a, rule):
    codes, scales, ts = scalify.block_quantize(np.ascontiguousarray(a, dtype=np.float32), "e4m3", (1, 32), rule, raw=True)
    assert ts == 1.0
    scales = np.asarray(scales)
    e8m0 = (np.log2(scales.astype(np.float64)) + 127).astype(np.int64)
    assert np.all(scales == np.exp2(e8m0 - 127.0))  # powers of two in the E8M0 range
    return np.asarray(codes), e8m0.astype(np.uint8), scales


@pytest.mark.parametrize("cfg,rule", [("mxfloor", "mx_floor"), ("mxrceil", "mx_ceil")])
def test_mx_codes_and_scales_exact(ref, cfg, rule):
    """Every cast of the three GEMMs, blocks of 32 along each GEMM's reduction (x, w along in_features; g
    and w^T along out_features; g^T, x^T along tokens): the same E8M0 scale bytes and e4m3 codes."""
    for i, op in enumerate(MX_OPERANDS):
        codes, e8m0, _ = scalify_mx(op(ref["x"], ref["w"], ref["go"]), rule)
        np.testing.assert_array_equal(e8m0, ref[f"{cfg}/op{i}/scale"], err_msg=f"{cfg} operand {i} scales")
        np.testing.assert_array_equal(codes, ref[f"{cfg}/op{i}/codes"], err_msg=f"{cfg} operand {i} codes")
    if cfg == "mxfloor":  # the data makes the floor rule saturate: x's block amax / scale beyond 464
        # (448 + half its ulp), e.g. x[20, 33] = 15.2 (significand 1.9); those elements are code 448
        amax = np.abs(ref["x"]).reshape(64, 3, 32).max(axis=2)
        k = ref["mxfloor/op0/scale"].astype(np.float64) - 127
        assert np.any(amax * np.exp2(-k) > 464) and ref["mxfloor/op0/codes"][20, 33] == 0x7E


@pytest.mark.parametrize("cfg,rule", [("mxfloor", "mx_floor"), ("mxrceil", "mx_ceil")])
def test_mx_gemms(ref, cfg, rule):
    """Decoded operands are exact (code * 2^k, f32) and equal on both sides, so Scalify's GEMMs are
    torchao's up to torchao's f32 accumulation: within the bound, against the float64 product."""
    vals = []
    for i, op in enumerate(MX_OPERANDS):
        a = op(ref["x"], ref["w"], ref["go"])
        codes, _, scales = scalify_mx(a, rule)
        v = np.asarray(scalify.block_dequantize(codes, scales, "e4m3", (1, 32), rule))
        # torchao's decode (to_dtype): code value * 2^(e8m0 - 127) in f32
        c = np.asarray(scalify.dequantize(ref[f"{cfg}/op{i}/codes"], "e4m3")).astype(np.float64)
        k = np.repeat(ref[f"{cfg}/op{i}/scale"].astype(np.float64) - 127, 32, axis=1)
        t = (c * np.exp2(k)).astype(np.float32)
        np.testing.assert_array_equal(v, t)
        vals.append(v)
    for name, exact in _mx_gemms([f64(v) for v in vals]):
        a, b = {"y": (vals[0], vals[1].T), "dx": (vals[2], vals[3].T), "dw": (vals[4], vals[5].T)}[name]
        bias = ref["b"] if name == "y" else None
        tol, _ = gemm_bound(a, b, bias)
        want = exact + (f64(bias) if bias is not None else 0)
        err = np.abs(f64(ref[f"{cfg}/{name}"]) - want)
        assert np.all(err <= tol), (cfg, name, float(np.max(err / tol)))


@pytest.mark.parametrize("cfg,rule", [("mxfloor", "mx_floor"), ("mxrceil", "mx_ceil")])
def test_mx_edge_blocks(ref, cfg, rule):
    """The edge tensor's blocks (make_reference.py): the scales agree everywhere; the codes agree in every
    block but those whose E8M0 byte is 0 (2^-127) and that hold a non-zero value. There torchao's FLOOR
    path divides by 2^-126 (mx_tensor.to_mx clamps the f32 scale to the smallest normal, keeping the
    byte 0): its codes are those of x * 2^126; RCEIL's exponent-0 case multiplies by 1: the codes of x."""
    e = ref["edge/x"]
    codes, e8m0, _ = scalify_mx(e, rule)
    t_codes = ref[f"edge/{cfg}/codes"].reshape(e.shape)
    np.testing.assert_array_equal(e8m0, ref[f"edge/{cfg}/scale"].reshape(e8m0.shape))
    named = []
    for r in range(e.shape[0]):
        for k in range(e.shape[1] // 32):
            blk = np.ascontiguousarray(e[r, 32 * k:32 * k + 32])
            if np.array_equal(codes[r, 32 * k:32 * k + 32], t_codes[r, 32 * k:32 * k + 32]):
                continue
            named.append((r, k))
            assert e8m0[r, k] == 0 and np.any(blk != 0), (r, k)
            torchao_rule = 2.0**126 if cfg == "mxfloor" else 1.0
            np.testing.assert_array_equal(t_codes[r, 32 * k:32 * k + 32], scalify.quantize(blk, "e4m3", torchao_rule, raw=True))
            np.testing.assert_array_equal(codes[r, 32 * k:32 * k + 32], scalify.quantize(blk, "e4m3", 2.0**127, raw=True))
    # the two such blocks: row 0 block 1 (amax ~2^-122) and row 1 block 0 (f32 subnormals); the all-zero
    # block (byte 0 too) agrees
    assert named == [(0, 1), (1, 0)]
