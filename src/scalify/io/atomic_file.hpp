#pragma once
// Writing a file so that readers see either the old file or the complete new one, never a part:
// the bytes go to a temporary file in the same folder, are flushed to disk (fsync), and the
// temporary is renamed over the target (atomic on POSIX file systems), then the folder is synced.
#include <functional>
#include <string>
#include <vector>

namespace scalify::io {

// `write` appends the content through the given sink (called any number of times); the bytes
// stream to disk through a small buffer, never held whole. Throws
// scalify::Error naming the path on any failure, leaving the previous file untouched and no
// temporary behind (unless the process itself dies: a later write removes a temporary whose
// writer has ended, never one of a live process). A target that exists and is not a regular
// file (a device such as /dev/null, a FIFO, a socket, a folder) is refused before anything is written.
using ByteSink = std::function<void(const void* data, size_t size)>;
void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& write);
// The same for a whole text (reports, CSV, plot scripts).
void write_text_atomically(const std::string& path, const std::string& text);

// Throws unless `out` (a file about to be written) is none of `inputs` (the same file under any
// name counts): an output never replaces what the command reads. `what` names the command.
void refuse_to_overwrite(const std::string& out, const std::vector<std::string>& inputs, const std::string& what);

// Creates a folder and its parents; an error naming it when a file is in the way or it cannot
// be made (instead of std::filesystem's exception).
void make_folder(const std::string& path);

// Test hook (fault injection): when the environment variable SCALIFY_TEST_DIE_DURING_WRITE names
// a target path's file name, the process kills itself (SIGKILL) after writing half the bytes
// (`write` then runs twice: once to count them).
// Used by the test that checks a killed write leaves the previous checkpoint readable.

}  // namespace scalify::io
