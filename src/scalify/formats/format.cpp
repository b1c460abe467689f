#include "scalify/formats/format.hpp"

#include <cctype>
#include <cmath>

#include "scalify/error.hpp"
#include "scalify/formats/scalar.hpp"

namespace scalify {

double max_value(Format f) { return decode(f, info(f).max_code()); }

double min_normal(Format f) {
  const FormatInfo& fi = info(f);
  if (!fi.is_float()) return 1.0;
  return std::ldexp(1.0, fi.emin());
}

double min_subnormal(Format f) {
  const FormatInfo& fi = info(f);
  if (!fi.is_float()) return 1.0;
  return fi.has_subnormals() ? std::ldexp(1.0, fi.emin() - fi.man_bits) : 0.0;
}

namespace {
bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}
}  // namespace

Format parse_format(std::string_view name) {
  for (const FormatInfo& fi : kFormats) {
    if (iequals(fi.name, name)) return fi.id;
    std::string_view rest = fi.aliases;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      if (iequals(rest.substr(0, comma), name)) return fi.id;
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
  }
  throw Error("unknown number format '" + std::string(name) + "'; valid formats: " + valid_format_names());
}

std::string_view format_name(Format f) { return info(f).name; }

std::string valid_format_names() {
  std::string out;
  for (const FormatInfo& fi : kFormats) {
    if (!out.empty()) out += ", ";
    out += fi.name;
    if (!fi.aliases.empty()) out += " (" + std::string(fi.aliases) + ")";
  }
  return out;
}

}  // namespace scalify
