// What npy.cpp (the .npy format), npz.cpp (numpy's zip container) and inputs.cpp (input files
// against a signature) share. The rules and messages are those of aotc_runtime/npz.py: what a file
// declares (entry count, names, each array's dtype and shape, sizes) is checked before any data is
// inflated or allocated, and then exactly the declared bytes are read.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "aotc/error.h"

namespace aotc {

constexpr size_t kMaxNpyHeader = 1 << 16;  // numpy's own bound for a header it reads safely; aotc_runtime's too
const std::string kReadableDtypes = "float16/32/64, int8/16/32/64, uint8 or bool";

// A regular file opened without blocking (a FIFO named as an input is refused, never waited on).
class InputFile {
 public:
  explicit InputFile(const std::string& path);  // throws "input file PATH does not exist" (exit 8)
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Exactly n bytes at offset; false when the file ends first.
  bool read_at(uint64_t offset, void* out, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

struct NpyHeader {
  std::string dtype;                     // numpy's name: "float32", "uint16", ...
  at::ScalarType type = at::kFloat;      // the tensor type it reads as
  std::vector<int64_t> shape;            // as the array is indexed (C order)
  bool fortran = false;
  uint64_t length = 0;                   // bytes before the data: magic, version, length field, header
  uint64_t data_bytes = 0;               // numel * itemsize (UINT64_MAX when that overflows)
  uint64_t total() const { return data_bytes > UINT64_MAX - length ? UINT64_MAX : length + data_bytes; }
};

// Where an array's .npy bytes are: a .npy file, or a stored or deflated zip entry.
struct ArraySource {
  std::shared_ptr<const InputFile> file;
  uint64_t offset = 0;       // first byte of the .npy in the file
  uint64_t stored_size = 0;  // bytes in the file (compressed, for a deflated entry)
  uint64_t size = 0;         // .npy bytes it gives at most (an entry's declared uncompressed size)
  bool deflated = false;
  bool check_crc = false;    // zip entries: the directory's CRC-32 is compared at the end of the data
  uint32_t crc = 0;
  std::string label, entry;  // "input file m.npz" and the entry's name, for the archive's messages
};

// Sequential reads of an array's .npy bytes: plain reads, or zlib's raw inflate fed at most
// stored_size bytes and never asked for more output than the caller's bound.
class NpyStream {
 public:
  NpyStream(const ArraySource& source, std::string where);
  ~NpyStream();
  NpyStream(const NpyStream&) = delete;
  NpyStream& operator=(const NpyStream&) = delete;

  size_t read(char* out, size_t n);  // up to n bytes; fewer only at the end of the data
  // All `size` bytes given (zipfile's end of an entry): the CRC-32 is checked here, as zipfile does.
  bool at_end();

 private:
  void refill();
  size_t inflate_some(char* out, size_t n);

  const ArraySource& source_;
  std::string where_;
  uint64_t consumed_ = 0;  // stored bytes read so far
  uint64_t produced_ = 0;  // .npy bytes given so far
  uint32_t crc_ = 0;
  bool ended_ = false;
  std::vector<char> input_;
  std::unique_ptr<struct z_stream_s> zs_;
};

// The header at the start of `stream` (aotc_runtime.npz.read_npy_header): read with bounded reads,
// its version, length, dtype and shape checked. `where` names the array in messages.
NpyHeader read_npy_header(NpyStream& stream, const std::string& where);

// The refusals of dtypes no signature has (check_header): not a plain bool/int/uint/float array, or big-endian.
void check_plain_dtype(const NpyHeader& header, const std::string& where);

// Exactly the header's data bytes, read into a tensor allocated for them (Fortran order made C
// order); more or fewer bytes than declared, or a CRC-32 that differs, is refused.
at::Tensor read_npy_data(NpyStream& stream, const NpyHeader& header, const std::string& where);

// One array found in an input file: its header read, its data not yet.
struct StoredArray {
  std::string where;  // "input file x.npy", "input file m.npz entry a.npy"
  ArraySource source;
  NpyHeader header;
  at::Tensor read() const;
};

// A .npy file's array, its header read (the size is checked by check_npy_size, after the signature).
StoredArray open_npy_file(const std::string& path);
void check_npy_size(const StoredArray& array);

// --- numpy's zip container (npz.cpp) ---

struct ZipEntry {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0, size = 0, local = 0;
};

struct ZipDirectory {
  std::shared_ptr<const InputFile> file;
  std::vector<ZipEntry> entries;
  uint64_t directory_at = 0;  // where the central directory starts: entries' data ends before it
};

// The archive's end record and directory (rules 1 of npz.py): `most` entries at most, else
// "holds N entries; EXPECTED: save one array per input", checked before the directory is read.
ZipDirectory read_zip_directory(const std::string& path, const std::string& label, size_t most, const std::string& expected);

// Entry `e` opened (not encrypted, stored or deflated, its local header consistent) with its .npy
// header read; its size against the header is checked by check_entry_size, after the signature.
StoredArray open_entry(const ZipDirectory& zip, const ZipEntry& e, const std::string& where, const std::string& label);
void check_entry_size(const StoredArray& array, const ZipEntry& e);

// A name from a file, for a one-line message: unprintable bytes as '?', at most `limit` characters.
std::string shown_text(const std::string& text, size_t limit = 40);

}  // namespace aotc
