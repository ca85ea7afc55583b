// Reading a small file that someone else may have put in place (a manifest, a signature, a key, a
// cpuinfo file) without ever blocking: a FIFO or a device where a file is expected would make a
// plain open() or read() wait forever for a writer.
#pragma once

#include <cstddef>
#include <string>

namespace aotc {

struct SmallFile {
  enum class Status { ok, missing, unreadable, not_regular, too_large };
  Status status = Status::missing;
  int error = 0;      // errno, when unreadable
  std::string bytes;  // the content, when ok

  bool ok() const { return status == Status::ok; }
};

// PATH's bytes when it is a regular file (symbolic links followed) of at most `limit` bytes.
// Opened O_NONBLOCK and checked with fstat on the open descriptor, so what is checked is what is
// read. Reads until end of file rather than trusting st_size (/proc files report 0).
SmallFile read_small_file(const std::string& path, size_t limit);

}  // namespace aotc
