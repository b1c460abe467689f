#pragma once
// EXPECT_ERROR(statement, text): the statement throws scalify::Error whose message contains text.
// Any other exception type escapes and fails the test.
#include <gtest/gtest.h>

#include <string>

#include "scalify/error.hpp"

namespace scalify::testing {

// The message of the scalify::Error f throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace scalify::testing

#define EXPECT_ERROR(statement, text)                                                                                 \
  do {                                                                                                                \
    const std::string expect_error_message = ::scalify::testing::error_of([&] { (void)(statement); });                \
    EXPECT_NE(expect_error_message.find(text), std::string::npos) << #statement << " gave: " << expect_error_message; \
  } while (0)
