#pragma once
// Runs gnuplot on a script file, without a shell (no quoting of paths can go wrong), its output
// going to <script>.log. gnuplot is optional: callers keep their data files and say so.
#include <string>

namespace scalify::report {

// "" on success, otherwise why not (not installed, exit status, see the log).
std::string run_gnuplot(const std::string& script_path);

// A string as a gnuplot single-quoted literal (quotes doubled).
std::string gnuplot_quote(const std::string& s);

}  // namespace scalify::report
