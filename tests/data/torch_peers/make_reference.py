"""Builds the torchao peer references of python/tests/test_torch_peers.py, once, by hand (the tests
never install torchao: what it computes is committed as data, reference.npz beside this script):

    /usr/bin/python3 -m venv /tmp/aovenv && scripts/install_torch_cpu.sh /tmp/aovenv
    /tmp/aovenv/bin/pip install --no-deps torchao==0.18.0
    /tmp/aovenv/bin/python tests/data/torch_peers/make_reference.py

Generated with torch 2.15.0 (the PyPI wheel, used on the CPU) and torchao 0.18.0 (pure Python; its
float8 training and MX modules import and run on the CPU without CUDA). The versions are stored in
the data ("meta", a JSON string).

One linear, torch layout: x [64, 96] f32 with outliers, weight [128, 96] (out x in), bias [128],
grad_output [64, 128], seeded. Four torchao configurations run forward + backward on it:

  f8      Float8Linear, Float8LinearConfig(emulate=True): tensorwise dynamic scaling (the default
          config), e4m3 input and weight, e5m2 grad_output, scale = 448 / amax (f64, then f32)
  f8pow2  the same with round_scales_to_power_of_2=True
  mxfloor MXFP8Linear(kernel_preference=EMULATED, scale_calculation_mode=FLOOR): e4m3 elements for
          all three operands, 32-element blocks along each GEMM's reduction, OCP floor E8M0 rule
  mxrceil the same with RCEIL (MXFP8Linear's default mode)

For each: "<cfg>/y" (output, bias added), "<cfg>/dx", "<cfg>/dw" (the three GEMMs), and every
quantised operand in the order torchao casts them, "<cfg>/op<i>/{codes,scale}": the FP8 codes as
uint8 bits of the cast's input (the operand below, transposed where torchao transposes it: the
script asserts the cast saw exactly that tensor), and the scale (f8: the f32 encode scale, x * scale
before the cast; MX: the biased E8M0 bytes, one per 32-element block along the last dim). Operand order:
  f8: 0 x, 1 w^T (fwd), 2 g, 3 w^T (grad_input), 4 g, 5 x (grad_weight)
  mx: 0 x, 1 w (fwd), 2 g, 3 w^T (grad_input), 4 g^T, 5 x^T (grad_weight)
Casts are recorded by wrapping torchao's own cast functions while the module runs, so they are the
operands its GEMMs used; the script asserts that y, dx, dw are bit for bit an f32 torch.mm of the
operands decoded from those codes and scales by torchao's definition (check_gemms).

Quantiser edge cases, outside the linear ("edge/..."): a [6, 64] f32 tensor of blocks chosen to
exercise the scale rules (an all-zero block, blocks whose amax is below the E8M0 range, f32
subnormals, an amax exactly at 448 * 2^k and one f32 ulp above, amax significands 1.75 and 1.875),
cast by torchao's to_mx with FLOOR and RCEIL ("edge/mxfloor/{codes,scale}", "edge/mxrceil/..."),
a per-tensor all-zero tensor's tensorwise scale ("edge/f8_zero_scale"), and the power-of-two
tensorwise scale of a tensor whose amax is one f32 ulp above 3.5 ("edge/f8pow2_near_{x,scale}").
"""
import json
import os

import numpy as np
import torch
import torchao
from torchao.float8 import Float8LinearConfig
from torchao.float8 import float8_scaling_utils
from torchao.float8.float8_linear import Float8Linear
from torchao.float8.float8_utils import tensor_to_scale
from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
from torchao.prototype.mx_formats import mx_tensor
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

HERE = os.path.dirname(os.path.abspath(__file__))


def inputs():
    g = torch.Generator().manual_seed(44)
    x = torch.randn(64, 96, generator=g)
    x[3, 7] = 40.0  # tensor outliers: the per-tensor scale comes from these
    x[10, 50] = -25.0
    x[20, 33] = 15.2  # a block whose amax significand (1.9) > 1.75: the MX floor rule saturates it
    x[40, 64:96] *= 1e-3  # a quiet block
    w = torch.randn(128, 96, generator=g) * 0.1
    w[17, 5] = 1.5
    b = torch.randn(128, generator=g) * 0.1
    go = torch.randn(64, 128, generator=g) * 1e-3
    go[5, 17] = 0.5
    go[33, 100] = -0.03
    return x, w, b, go


def bits(t):
    return t.contiguous().view(torch.uint8).numpy().copy()


def run_linear(mod, x, w, b, go, record):
    with torch.no_grad():
        mod.weight.copy_(w)
        mod.bias.copy_(b)
    xx = x.clone().requires_grad_(True)
    y = mod(xx)
    y.backward(go)
    return {"y": y.detach().numpy(), "dx": xx.grad.numpy(), "dw": mod.weight.grad.numpy()}, record


def float8(cfg_pow2, x, w, b, go):
    record = []
    orig = float8_scaling_utils.hp_tensor_and_scale_to_float8

    def wrapped(hp, scale, dtype, *a, **k):
        out = orig(hp, scale, dtype, *a, **k)
        record.append({"hp": hp.detach().numpy().copy(), "codes": bits(out._data),
                       "scale": np.array(scale.detach().numpy(), dtype=np.float32).reshape(1)})
        return out

    float8_scaling_utils.hp_tensor_and_scale_to_float8 = wrapped
    try:
        cfg = Float8LinearConfig(emulate=True, round_scales_to_power_of_2=cfg_pow2)
        mod = Float8Linear.from_float(torch.nn.Linear(96, 128), config=cfg)
        return run_linear(mod, x, w, b, go, record)
    finally:
        float8_scaling_utils.hp_tensor_and_scale_to_float8 = orig


def mx(mode, x, w, b, go):
    record = []
    orig = mx_tensor.to_mx

    def wrapped(data_hp, elem_dtype, block_size, scaling_mode=ScaleCalculationMode.FLOOR, *a, **k):
        scale, data = orig(data_hp, elem_dtype, block_size, scaling_mode, *a, **k)
        assert scaling_mode == mode and elem_dtype == torch.float8_e4m3fn and block_size == 32
        record.append({"hp": data_hp.detach().numpy().copy(), "codes": bits(data), "scale": bits(scale)})
        return scale, data

    mx_tensor.to_mx = wrapped
    try:
        mod = MXFP8Linear(96, 128, kernel_preference=KernelPreference.EMULATED, scale_calculation_mode=mode)
        return run_linear(mod, x, w, b, go, record)
    finally:
        mx_tensor.to_mx = orig


def edge_tensor():
    """[6, 64]: two 32-element blocks a row."""
    g = torch.Generator().manual_seed(7)
    e = torch.randn(6, 64, generator=g)
    e[0, 0:32] = 0.0  # all-zero block
    e[0, 32:64] *= 2.0**-124  # amax ~2^-122: E8M0 exponent clamps at -127
    e[1, 0:32] = e[1, 0:32] * 2.0**-130  # f32 subnormals
    e[1, 32:64] *= 2.0**-110  # small but inside the E8M0 range
    e[2, 0:32] = e[2, 0:32] / e[2, 0:32].abs().max() * 448.0 * 2.0**-3  # amax exactly 448 * 2^-3
    blk = e[2, 32:64] / e[2, 32:64].abs().max() * 448.0 * 2.0**-3
    blk[blk.abs().argmax()] = torch.nextafter(torch.tensor(56.0), torch.tensor(100.0))  # one ulp above
    e[2, 32:64] = blk
    e[3, 0:32] = e[3, 0:32] / e[3, 0:32].abs().max() * 1.75 * 4  # amax significand 1.75 (448's)
    e[3, 32:64] = e[3, 32:64] / e[3, 32:64].abs().max() * 1.875 * 4  # 1.875: floor saturates it
    e[4, 0:32] *= 2.0**-119  # near the floor rule's clamp (floor(log2 amax) - 8 ~ -127)
    e[5, 32:64] *= 1000.0
    return e


EXPECT_F8 = [lambda x, w, g: x, lambda x, w, g: w.t(), lambda x, w, g: g,
             lambda x, w, g: w.t(), lambda x, w, g: g, lambda x, w, g: x]
EXPECT_MX = [lambda x, w, g: x, lambda x, w, g: w, lambda x, w, g: g,
             lambda x, w, g: w.t(), lambda x, w, g: g.t(), lambda x, w, g: x.t()]


def check_gemms(name, res, rec, b):
    """torchao's y, dx, dw are, bit for bit, an f32 torch.mm of the operands its definition decodes from
    the recorded codes and scales (f8: code / scale; MX: code * 2^(byte - 127)), + bias for y. What is
    left to the test is the summation order of torch.mm, which differs between BLAS builds and ISAs."""
    def dec(i):
        r = rec[i]
        if name.startswith("f8"):
            dt = torch.float8_e5m2 if i in (2, 4) else torch.float8_e4m3fn
            return torch.from_numpy(r["codes"]).view(dt).float() / torch.from_numpy(r["scale"])[0]
        c = torch.from_numpy(r["codes"]).view(torch.float8_e4m3fn).float()
        k = torch.from_numpy(r["scale"]).to(torch.float32) - 127
        return (c.reshape(-1, 32) * torch.exp2(k).reshape(-1, 1)).reshape(c.shape)
    v = [dec(i) for i in range(6)]
    if name.startswith("f8"):
        want = {"y": torch.mm(v[0], v[1]) + b, "dx": torch.mm(v[2], v[3].t()), "dw": torch.mm(v[4].t(), v[5])}
    else:
        want = {"y": torch.mm(v[0], v[1].t()) + b, "dx": torch.mm(v[2], v[3].t()), "dw": torch.mm(v[4], v[5].t())}
    for k, t in want.items():
        assert np.array_equal(t.numpy(), res[k]), (name, k)


def main():
    torch.manual_seed(0)
    x, w, b, go = inputs()
    out = {"x": x.numpy(), "w": w.numpy(), "b": b.numpy(), "go": go.numpy()}
    runs = {
        "f8": lambda: float8(False, x, w, b, go),
        "f8pow2": lambda: float8(True, x, w, b, go),
        "mxfloor": lambda: mx(ScaleCalculationMode.FLOOR, x, w, b, go),
        "mxrceil": lambda: mx(ScaleCalculationMode.RCEIL, x, w, b, go),
    }
    for name, fn in runs.items():
        res, rec = fn()
        assert len(rec) == 6, (name, len(rec))
        for k, v in res.items():
            out[f"{name}/{k}"] = v
        expect = EXPECT_F8 if name.startswith("f8") else EXPECT_MX
        for i, r in enumerate(rec):
            # the cast's input is the operand the docstring names (not stored: it is x, w or go)
            assert np.array_equal(r.pop("hp"), expect[i](x, w, go).numpy()), (name, i)
            for k, v in r.items():
                out[f"{name}/op{i}/{k}"] = v
        check_gemms(name, res, rec, b)
    e = edge_tensor()
    out["edge/x"] = e.numpy()
    for name, mode in (("mxfloor", ScaleCalculationMode.FLOOR), ("mxrceil", ScaleCalculationMode.RCEIL)):
        scale, data = mx_tensor.to_mx(e.contiguous(), torch.float8_e4m3fn, 32, mode)
        out[f"edge/{name}/codes"] = bits(data)
        out[f"edge/{name}/scale"] = bits(scale)
    out["edge/f8_zero_scale"] = np.array(tensor_to_scale(torch.zeros(4, 4), torch.float8_e4m3fn).numpy(),
                                         dtype=np.float32).reshape(1)
    # power-of-two rounding of a scale just below a power of two: amax one f32 ulp above 3.5 makes
    # 448 / amax = 128 (1 - 6.8e-8), which f32 keeps below 128 but whose f32 log2 rounds to 7
    near = torch.tensor([[torch.nextafter(torch.tensor(3.5), torch.tensor(4.0)).item(), 1.0], [-0.5, 0.25]])
    out["edge/f8pow2_near_x"] = near.numpy()
    near_scale = tensor_to_scale(near, torch.float8_e4m3fn, round_scales_to_power_of_2=True)
    out["edge/f8pow2_near_scale"] = np.array(near_scale.numpy(), dtype=np.float32).reshape(1)
    meta = {"torch": torch.__version__, "torchao": torchao.__version__, "numpy": np.__version__,
            "script": "tests/data/torch_peers/make_reference.py"}
    out["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(os.path.join(HERE, "reference.npz"), **out)
    print(meta, sum(v.nbytes for v in out.values()), "bytes raw")


if __name__ == "__main__":
    main()
