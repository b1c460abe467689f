// `scalify formats`: the format table, derived from the descriptors (nothing typed in).
#include <cmath>
#include <cstdio>
#include <string>

#include "commands.hpp"
#include "scalify/formats/format.hpp"

namespace scalify::cli {
namespace {

std::string pow2_or_value(double v) {
  if (v == 0) return "-";
  const int e = std::ilogb(v);
  if (std::ldexp(1.0, e) == v && (e < -4 || e > 16)) return "2^" + std::to_string(e);
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string nan_text(const FormatInfo& f) {
  char b[48];
  switch (f.specials) {
    case Specials::ieee: return "IEEE";
    case Specials::fn: std::snprintf(b, sizeof b, "0x%X/0x%X", f.nan_code(), f.nan_code() | f.sign_mask()); return b;
    case Specials::fnuz:
    case Specials::e8m0: std::snprintf(b, sizeof b, "0x%X only", f.nan_code()); return b;
    default: return "none";
  }
}

void print_table(bool csv) {
  const char* head[] = {"name", "bits", "E", "M", "bias", "max", "min normal", "min subnormal", "inf", "NaN", "-0", "description"};
  if (csv) {
    for (int i = 0; i < 12; ++i) std::printf("%s%s", i ? "," : "", head[i]);
    std::printf("\n");
  } else {
    std::printf("%-12s %4s %2s %2s %4s %12s %11s %13s %4s %13s %3s  %s\n", head[0], head[1], head[2], head[3], head[4], head[5], head[6],
                head[7], head[8], head[9], head[10], head[11]);
  }
  for (const FormatInfo& f : kFormats) {
    const std::string e = f.is_float() ? std::to_string(f.exp_bits) : "-";
    const std::string m = f.is_float() ? std::to_string(f.man_bits) : "-";
    const std::string bias = f.is_float() ? std::to_string(f.bias) : "-";
    const std::string mx = pow2_or_value(max_value(f.id));
    const std::string mn = f.is_float() ? pow2_or_value(min_normal(f.id)) : "-";
    const std::string ms = pow2_or_value(min_subnormal(f.id));
    const char* inf = f.has_inf() ? "yes" : "no";
    const char* nz = f.has_negative_zero() ? "yes" : "no";
    if (csv)
      std::printf("%s,%d,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", std::string(f.name).c_str(), f.bits, e.c_str(), m.c_str(), bias.c_str(),
                  mx.c_str(), mn.c_str(), ms.c_str(), inf, nan_text(f).c_str(), nz, std::string(f.note).c_str());
    else
      std::printf("%-12s %4d %2s %2s %4s %12s %11s %13s %4s %13s %3s  %s\n", std::string(f.name).c_str(), f.bits, e.c_str(), m.c_str(),
                  bias.c_str(), mx.c_str(), mn.c_str(), ms.c_str(), inf, nan_text(f).c_str(), nz, std::string(f.note).c_str());
  }
  if (!csv) {
    std::printf("\nAliases:\n");
    for (const FormatInfo& f : kFormats) std::printf("  %-12s %s\n", std::string(f.name).c_str(), std::string(f.aliases).c_str());
  }
}

}  // namespace

void add_formats_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("formats", "Print the number-format table (SPEC §1)");
  auto csv = std::make_shared<bool>(false);
  cmd->add_flag("--csv", *csv, "Print CSV instead of an aligned table");
  cmd->callback([csv] { print_table(*csv); });
}

}  // namespace scalify::cli
