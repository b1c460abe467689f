// A user program built against the installed package: encodes and decodes through the library.
#include <cstdio>

#include "scalify/formats/bulk.hpp"
#include "scalify/formats/scalar.hpp"

int main() {
  const auto f = scalify::parse_format("fp8_e4m3fn");
  const float back = scalify::decode(f, scalify::encode(f, 464.0f));
  std::printf("e4m3(464) = %g\n", back);
  return back == 448.0f ? 0 : 1;
}
