// The helpers the binding files share (bindings.hpp).
#include <string>

#include "bindings.hpp"
#include "scalify/error.hpp"

namespace scalify::python {

Rounding parse_rounding(const std::string& r) {
  if (r == "nearest" || r == "nearest_even") return Rounding::nearest_even;
  if (r == "stochastic") return Rounding::stochastic;
  if (r == "toward_zero") return Rounding::toward_zero;
  throw Error("rounding must be 'nearest', 'stochastic' or 'toward_zero', got '" + r + "'");
}
const char* rounding_name(Rounding r) {
  return r == Rounding::nearest_even ? "nearest" : r == Rounding::stochastic ? "stochastic" : "toward_zero";
}

const std::string& without_nul(const std::string& text, const std::string& what) {
  if (text.find('\0') == std::string::npos) return text;
  std::string shown;
  for (char ch : text) shown += ch == '\0' ? std::string("\\0") : std::string(1, ch);
  throw Error(what + " holds a NUL character: '" + shown + "'");
}

Shape shape_from(const std::vector<size_t>& s) {
  Shape out;
  for (size_t d : s) out.push_back(int64_t(d));
  return out;
}
std::vector<size_t> shape_to(const Shape& s) {
  std::vector<size_t> out;
  for (int64_t d : s) out.push_back(size_t(d));
  return out;
}

Tensor ids_from(const IdArray& a) {
  return Tensor::from_indices(std::vector<int64_t>(a.data(), a.data() + a.size()), shape_from(shape_of(a)));
}

}  // namespace scalify::python
