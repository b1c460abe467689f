#!/usr/bin/env python3
"""Reference FP4 block quantisations, computed from the published definitions in plain Python (no
numpy, nothing from Scalify), written once to fp4_reference.txt and committed.

NVFP4 (TransformerEngine's NVFP4BlockScaling, arXiv 2509.25149), in f32 arithmetic:
  S = min(448 * 6 / amax(tensor), FLT_MAX)          (1 when amax is 0)
  b = e4m3(amax(block) / 6 * S)                     (round to nearest even, saturating)
  code = e2m1(x * (S / b))                          (round to nearest even, saturating; 0 if b = 0)
  value = code * b * (1 / S)
e4m3_amax: the same with S = 1. MXFP4 (OCP MX v1.0): E8M0 scale 2^(floor(log2 amax) - 2) per 32
elements (floor), or the smallest 2^k with amax / 2^k <= 6 (ceil); code = e2m1(x / scale).

Every f32 operation is done in f64 and rounded to f32, which gives the correctly rounded f32
result for one +, -, * or / of f32 operands (f64 carries more than 2 * 24 + 2 bits).

Run: python3 tests/data/fp4/make_reference.py > tests/data/fp4/fp4_reference.txt
Format, one case per block of lines:
  case <name> <rule> <rows> <cols> <block_rows> <block_cols>
  x <rows*cols f32 values as hex>
  codes <rows*cols e2m1 codes, 0..15>
  scales <block scales as hex>
  tensor_scale <hex>
"""
import math
import random
import struct

FLT_MAX = struct.unpack("f", struct.pack("I", 0x7F7FFFFF))[0]


def f32(x):
    if math.isinf(x) or abs(x) > FLT_MAX * (1 + 2**-25):
        return math.copysign(math.inf, x)
    return struct.unpack("f", struct.pack("f", x))[0]


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # codes 0..7; the sign is bit 3


def e4m3_value(code):
    e, m = code >> 3, code & 7
    return m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


E4M3 = [e4m3_value(c) for c in range(127)]  # positive finite codes 0..126 (126 = 448)


def nearest_even(values, a):
    """Index of the value nearest to a >= 0 in the ascending list, ties to the even index,
    saturating at the last."""
    if a >= values[-1]:
        return len(values) - 1
    best = min(range(len(values)), key=lambda i: (abs(values[i] - a), i % 2))
    return best


def e2m1_code(x):
    """The sign bit is kept, as on every cast: -0.1 becomes -0 (code 8)."""
    code = nearest_even(E2M1, abs(x))
    return code | (8 if math.copysign(1.0, x) < 0 else 0)


def e2m1_decode(code):
    v = E2M1[code & 7]
    return -v if code & 8 else v


def e4m3_round(a):
    return E4M3[nearest_even(E4M3, a)]


def blocks(rows, cols, br, bc):
    for r0 in range(0, rows, br):
        for c0 in range(0, cols, bc):
            yield [(r, c) for r in range(r0, min(rows, r0 + br)) for c in range(c0, min(cols, c0 + bc))]


def nvfp4(x, rows, cols, br, bc, tensor_scale):
    amax = max(abs(v) for v in x)
    s = 1.0
    if tensor_scale and amax > 0:
        s = min(f32(448.0 * 6.0 / amax), FLT_MAX)
    codes, scales = [0] * len(x), []
    for blk in blocks(rows, cols, br, bc):
        bamax = max(abs(x[r * cols + c]) for r, c in blk)
        b = e4m3_round(f32(f32(bamax / 6.0) * s))
        scales.append(b)
        mul = f32(s / b) if b > 0 else 0.0
        for r, c in blk:
            codes[r * cols + c] = e2m1_code(f32(x[r * cols + c] * mul))
    return codes, scales, f32(1.0 / s)


def mxfp4(x, rows, cols, br, bc, ceil):
    codes, scales = [0] * len(x), []
    for blk in blocks(rows, cols, br, bc):
        bamax = max(abs(x[r * cols + c]) for r, c in blk)
        if bamax == 0:
            k = -127
        else:
            k = math.floor(math.log2(bamax)) - 2
            if ceil:
                k = math.floor(math.log2(bamax)) - 2
                while bamax / 2.0**k > 6.0:
                    k += 1
                while k > -127 and bamax / 2.0 ** (k - 1) <= 6.0:
                    k -= 1
        k = max(-127, min(127, k))
        scale = 2.0**k
        scales.append(scale)
        for r, c in blk:
            codes[r * cols + c] = e2m1_code(f32(x[r * cols + c] / scale))
    return codes, scales, 1.0


def tensor(rng, rows, cols, kind):
    x = [f32(rng.gauss(0, 1)) for _ in range(rows * cols)]
    if kind == "outliers":
        for i in rng.sample(range(rows * cols), max(1, rows * cols // 40)):
            x[i] = f32(x[i] * 37.0)
    if kind == "tiny":
        x = [f32(v * 1e-30) for v in x]
    if kind == "zero_block":
        for c in range(16):
            x[c] = 0.0
    if kind == "gradients":
        x = [f32(v * 3e-5) for v in x]
    return x


def main():
    rng = random.Random(2026)
    cases = [
        ("nvfp4_rows", "nvfp4", 4, 64, 1, 16, "outliers"),
        ("nvfp4_square", "nvfp4", 32, 48, 16, 16, "outliers"),
        ("nvfp4_zero_block", "nvfp4", 2, 32, 1, 16, "zero_block"),
        ("nvfp4_tiny", "nvfp4", 2, 32, 1, 16, "tiny"),
        ("nvfp4_gradients", "nvfp4", 16, 32, 16, 1, "gradients"),
        ("e4m3_amax_rows", "e4m3_amax", 4, 64, 1, 16, "outliers"),
        ("e4m3_amax_gradients", "e4m3_amax", 4, 32, 1, 16, "gradients"),
        ("mxfp4_floor", "mx_floor", 4, 64, 1, 32, "outliers"),
        ("mxfp4_ceil", "mx_ceil", 4, 64, 1, 32, "outliers"),
    ]
    for name, rule, rows, cols, br, bc, kind in cases:
        x = tensor(rng, rows, cols, kind)
        if rule in ("nvfp4", "e4m3_amax"):
            codes, scales, ts = nvfp4(x, rows, cols, br, bc, rule == "nvfp4")
        else:
            codes, scales, ts = mxfp4(x, rows, cols, br, bc, rule == "mx_ceil")
        print(f"case {name} {rule} {rows} {cols} {br} {bc}")
        print("x " + " ".join(float(v).hex() for v in x))
        print("codes " + " ".join(str(c) for c in codes))
        print("scales " + " ".join(float(s).hex() for s in scales))
        print(f"tensor_scale {float(ts).hex()}")


if __name__ == "__main__":
    main()
