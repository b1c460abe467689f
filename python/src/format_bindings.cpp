// Number formats: quantize / dequantize (elementwise and block-scaled) and the formats' table.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstring>
#include <span>

#include "bindings.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/block.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/format.hpp"

namespace scalify::python {
namespace {

// Codes of `fmt` in their storage type (uint8, uint16 or uint32 per code).
nb::object codes_array(Bytes bytes, Format fmt, const std::vector<size_t>& shape) {
  switch (info(fmt).storage_bytes()) {
    case 1: return owned_array<uint8_t>(std::move(bytes), shape);
    case 2: return owned_array<uint16_t>(std::move(bytes), shape);
    default: return owned_array<uint32_t>(std::move(bytes), shape);
  }
}

std::span<const std::byte> code_bytes(const CodeArray& codes, Format fmt) {
  const size_t cb = size_t(info(fmt).storage_bytes());
  if (codes.itemsize() != cb)
    throw Error(std::string("codes of ") + std::string(format_name(fmt)) + " take " + std::to_string(cb) +
                " byte(s) each, got an array of " + std::to_string(codes.itemsize()) + "-byte items");
  return {static_cast<const std::byte*>(codes.data()), codes.size() * cb};
}

nb::object quantize(FloatArray x, const std::string& format, float scale, const std::string& rounding, uint64_t seed, bool saturate) {
  const Format fmt = parse_format(format);
  QuantizeOptions o;
  o.rounding = parse_rounding(rounding);
  o.seed = seed;
  o.overflow = saturate ? Overflow::saturate : Overflow::non_saturating;
  Bytes out(x.size() * size_t(info(fmt).storage_bytes()));
  {
    nb::gil_scoped_release release;
    scalify::quantize(std::span(x.data(), x.size()), fmt, scale, out, o);
  }
  return codes_array(std::move(out), fmt, shape_of(x));
}

nb::object dequantize(CodeArray codes, const std::string& format, float scale) {
  const Format fmt = parse_format(format);
  const std::span<const std::byte> bytes = code_bytes(codes, fmt);
  Floats out(codes.size());
  {
    nb::gil_scoped_release release;
    scalify::dequantize(bytes, fmt, scale, out);
  }
  return owned_array<float>(std::move(out), shape_of(codes));
}

// scale_codes: the block scales as E8M0 codes (MX rules only, whose scales are powers of two).
nb::tuple block_quantize(FloatArray x, const std::string& format, std::pair<size_t, size_t> block, const std::string& rule,
                         const std::string& rounding, uint64_t seed, bool scale_codes) {
  if (x.ndim() != 2) throw Error("block_quantize: needs a 2-D array, got " + std::to_string(x.ndim()) + " dimensions");
  const Format fmt = parse_format(format);
  const BlockScaleRule scale_rule = parse_block_rule(rule);
  if (scale_codes && !pow2_block_scales(scale_rule))
    throw Error("block_quantize: E8M0 scale codes need an MX rule (mx_floor or mx_ceil), whose scales are powers of two; rule '" + rule +
                "' has float32 scales");
  BlockQuantized q;
  {
    nb::gil_scoped_release release;
    q = quantize_blocks(std::span(x.data(), x.size()), x.shape(0), x.shape(1), fmt, BlockSpec{block.first, block.second, scale_rule},
                        parse_rounding(rounding), seed);
  }
  Bytes codes(q.codes.begin(), q.codes.end());
  const std::vector<size_t> scale_shape{q.scale_rows(), q.scale_cols()};
  nb::object scales =
      scale_codes ? owned_array<uint8_t>(q.e8m0_scales(), scale_shape) : owned_array<float>(std::move(q.scales), scale_shape);
  return nb::make_tuple(codes_array(std::move(codes), fmt, shape_of(x)), scales, q.tensor_scale);
}

nb::object block_dequantize(CodeArray codes, FloatArray scales, const std::string& format, std::pair<size_t, size_t> block,
                            const std::string& rule, float tensor_scale) {
  if (codes.ndim() != 2) throw Error("block_dequantize: codes must be a 2-D array");
  const Format fmt = parse_format(format);
  BlockQuantized q;
  q.element = fmt;
  q.rows = codes.shape(0);
  q.cols = codes.shape(1);
  q.block = BlockSpec{block.first, block.second, parse_block_rule(rule)};
  const std::span<const std::byte> bytes = code_bytes(codes, fmt);
  q.codes.assign(bytes.begin(), bytes.end());
  q.scales.assign(scales.data(), scales.data() + scales.size());
  q.tensor_scale = tensor_scale;
  Floats out(q.rows * q.cols);
  dequantize_blocks(q, out);
  return owned_array<float>(std::move(out), {q.rows, q.cols});
}

nb::list formats() {
  nb::list out;
  for (const FormatInfo& f : kFormats) {
    nb::dict d;
    d["name"] = std::string(f.name);
    d["bits"] = f.bits;
    d["exponent_bits"] = f.exp_bits;
    d["mantissa_bits"] = f.man_bits;
    d["max"] = max_value(f.id);
    d["min_normal"] = f.is_float() ? min_normal(f.id) : 1.0;
    d["min_subnormal"] = f.is_float() ? min_subnormal(f.id) : 1.0;
    d["has_inf"] = f.has_inf();
    d["has_nan"] = f.has_nan();
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_formats(nb::module_& m) {
  using namespace nb::literals;
  // Signatures written out where nanobind's would say `object` / bare `tuple` (the stubs' types).
#define SCALIFY_F32_IN "Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]"
#define SCALIFY_CODES_OUT "NDArray[numpy.uint8] | NDArray[numpy.uint16] | NDArray[numpy.uint32]"
#define SCALIFY_CODES_IN "Annotated[" SCALIFY_CODES_OUT ", dict(order='C', device='cpu')]"
  m.def("quantize", &quantize,
        nb::sig("def quantize(x: " SCALIFY_F32_IN ", format: str, scale: float = 1.0, rounding: str = 'nearest', seed: int = 0, "
                "saturate: bool = True) -> " SCALIFY_CODES_OUT),
        "x"_a, "format"_a, "scale"_a = 1.0f, "rounding"_a = "nearest", "seed"_a = 0, "saturate"_a = true);
  m.def("dequantize", &dequantize,
        nb::sig("def dequantize(codes: " SCALIFY_CODES_IN ", format: str, scale: float = 1.0) -> NDArray[numpy.float32]"), "codes"_a,
        "format"_a, "scale"_a = 1.0f);
  m.def(
      "amax", [](FloatArray x) { return scalify::amax(std::span(x.data(), x.size())); }, "x"_a);
  m.def("block_quantize", &block_quantize,
        nb::sig("def block_quantize(x: " SCALIFY_F32_IN ", format: str, block: tuple[int, int], rule: str, rounding: str = 'nearest', "
                "seed: int = 0, scale_codes: bool = False) -> tuple[" SCALIFY_CODES_OUT
                ", NDArray[numpy.float32] | NDArray[numpy.uint8], float]"),
        "x"_a, "format"_a, "block"_a, "rule"_a, "rounding"_a = "nearest", "seed"_a = 0, "scale_codes"_a = false);
  m.def("block_dequantize", &block_dequantize,
        nb::sig("def block_dequantize(codes: " SCALIFY_CODES_IN ", scales: " SCALIFY_F32_IN
                ", format: str, block: tuple[int, int], rule: str, tensor_scale: float = 1.0) -> NDArray[numpy.float32]"),
        "codes"_a, "scales"_a, "format"_a, "block"_a, "rule"_a, "tensor_scale"_a = 1.0f);
#undef SCALIFY_F32_IN
#undef SCALIFY_CODES_IN
#undef SCALIFY_CODES_OUT
  m.def("formats", &formats, nb::sig("def formats() -> list[dict[str, str | int | float | bool]]"));
  // A format's name from any of its names or aliases ("float8_e4m3fn" -> "e4m3"); ValueError listing them if unknown.
  m.def(
      "format_name", [](const std::string& name) { return std::string(format_name(parse_format(name))); }, "name"_a);
  // Whether a block rule's scales are powers of two, stored as E8M0 codes (the MX rules).
  m.def(
      "has_e8m0_scales", [](const std::string& rule) { return pow2_block_scales(parse_block_rule(rule)); }, "rule"_a);
  // The address of the memory the bindings read for x: equal to x's own when no copy was made.
  // x: anything the bindings read as float32 (a NumPy array, a DLPack tensor such as torch's).
  m.def(
      "data_pointer", [](FloatArray x) { return reinterpret_cast<uintptr_t>(x.data()); }, nb::sig("def data_pointer(x: object) -> int"),
      "x"_a);
}

}  // namespace scalify::python
