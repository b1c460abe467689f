#pragma once
// Notes: things a user should know that are not errors (a checkpoint loaded without checksums to
// verify). The library says them here; where they go is the application's choice.
#include <functional>
#include <string>

namespace scalify {

// Says `message` through the current sink (by default: "scalify: note: <message>" on stderr).
void note(const std::string& message);
// Replaces the sink (an empty function silences notes); returns the previous one.
std::function<void(const std::string&)> set_note_sink(std::function<void(const std::string&)> sink);

}  // namespace scalify
