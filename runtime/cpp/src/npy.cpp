// The .npy format (numpy.lib.format, NEP 1), read the way aotc_runtime/npz.py reads it: the header
// through bounded reads, every field checked before anything is allocated from it, then exactly
// the declared data bytes straight into the tensor. Also .npz writing (stored entries, zlib's
// CRC-32). The zip container on the reading side is npz.cpp.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "aotc/npy.h"
#include "npy_format.h"

namespace aotc {
namespace {

struct Dtype {
  std::string name;  // numpy's
  at::ScalarType type;
};

// The plain little-endian (or byte-order-free) dtypes: numpy's descr -> name and tensor type.
// uint16/32/64 are read only to be named in the signature's refusal (no package takes them).
const std::map<std::string, Dtype> kPlain = {
    {"<f2", {"float16", at::kHalf}},   {"<f4", {"float32", at::kFloat}},  {"<f8", {"float64", at::kDouble}},
    {"|i1", {"int8", at::kChar}},      {"<i1", {"int8", at::kChar}},      {"<i2", {"int16", at::kShort}},
    {"<i4", {"int32", at::kInt}},      {"<i8", {"int64", at::kLong}},     {"|u1", {"uint8", at::kByte}},
    {"<u1", {"uint8", at::kByte}},     {"<u2", {"uint16", at::kUInt16}},  {"<u4", {"uint32", at::kUInt32}},
    {"<u8", {"uint64", at::kUInt64}},  {"|b1", {"bool", at::kBool}},      {"<b1", {"bool", at::kBool}}};

std::string descr_of(at::ScalarType type) {
  switch (type) {
    case at::kHalf: return "<f2";
    case at::kFloat: return "<f4";
    case at::kDouble: return "<f8";
    case at::kChar: return "|i1";
    case at::kShort: return "<i2";
    case at::kInt: return "<i4";
    case at::kLong: return "<i8";
    case at::kByte: return "|u1";
    case at::kBool: return "|b1";
    default: throw usage_error(std::string("cannot write dtype ") + c10::toString(type) + " to .npz");
  }
}

void put32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put16(std::string& s, uint16_t v) {
  s += static_cast<char>(v & 0xff);
  s += static_cast<char>(v >> 8);
}

std::string npy_bytes(const at::Tensor& input) {
  at::Tensor t = input.detach().cpu();
  if (t.scalar_type() == at::kBFloat16) t = t.to(at::kFloat);  // numpy has no bfloat16: widen, as the Python runtime does
  t = t.contiguous();
  std::string shape = "(";
  for (int64_t d : t.sizes()) shape += std::to_string(d) + ",";
  if (t.dim() > 1) shape.pop_back();
  shape += ")";
  std::string header = "{'descr': '" + descr_of(t.scalar_type()) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::string out("\x93NUMPY\x01\x00", 8);
  put16(out, static_cast<uint16_t>(header.size()));
  out += header;
  out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return out;
}

Error refused(const std::string& where, const std::string& problem) { return input_error(where + " " + problem); }

// Exactly n bytes of the header, or the refusal of a file that ends inside it.
void read_exactly(NpyStream& stream, char* out, size_t n, const std::string& where) {
  if (stream.read(out, n) != n) throw refused(where, "is truncated in its .npy header; save it again");
}

// The header dict's fields. numpy writes a Python dict literal; only the three keys it writes are
// read, each by a pattern that accepts nothing but a literal of the expected kind.
void parse_fields(const std::string& text, NpyHeader& h, const std::string& where) {
  auto unreadable = [&](const std::string& why) {
    return refused(where, "has a .npy header numpy would not read (" + why + "); save it with numpy.save");
  };
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(R"('descr'\s*:\s*'([^']*)')"))) throw unreadable("no 'descr' string");
  std::string descr = m[1];
  if (!std::regex_search(text, m, std::regex(R"('fortran_order'\s*:\s*(True|False))"))) throw unreadable("no 'fortran_order'");
  h.fortran = m[1] == "True";
  if (!std::regex_search(text, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))"))) throw unreadable("no 'shape' tuple");
  std::stringstream dims(m[1].str());
  std::string item;
  h.data_bytes = 1;
  bool overflow = false;
  while (std::getline(dims, item, ',')) {
    item.erase(0, item.find_first_not_of(" "));
    item.erase(item.find_last_not_of(" ") + 1);
    if (item.empty()) continue;
    if (item.find_first_not_of("0123456789") != std::string::npos || item.size() > 18) {
      throw refused(where, "declares shape (" + shown_text(m[1].str()) + "), which is not a tuple of sizes; save it with numpy.save");
    }
    int64_t dim = std::stoll(item);
    h.shape.push_back(dim);
    overflow = overflow || __builtin_mul_overflow(h.data_bytes, static_cast<uint64_t>(dim), &h.data_bytes);
  }
  auto plain = kPlain.find(descr);
  h.dtype = plain == kPlain.end() ? descr : plain->second.name;
  h.type = plain == kPlain.end() ? at::kFloat : plain->second.type;
  if (plain == kPlain.end()) return;  // check_plain_dtype refuses it, naming the descr
  uint64_t itemsize = c10::elementSize(h.type);
  overflow = overflow || __builtin_mul_overflow(h.data_bytes, itemsize, &h.data_bytes);
  if (overflow) h.data_bytes = UINT64_MAX;  // more than any file holds: the size checks refuse it
}

}  // namespace

std::string shown_text(const std::string& text, size_t limit) {
  // Python's str.isprintable per character: ASCII controls and broken UTF-8 become '?'.
  std::vector<std::string> chars;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool valid = len > 0 && i + len <= text.size();
    for (size_t k = 1; valid && k < len; ++k) valid = (static_cast<unsigned char>(text[i + k]) >> 6) == 2;
    if (!valid) {
      chars.push_back("?");
      ++i;
      continue;
    }
    chars.push_back(len == 1 && (c < 0x20 || c == 0x7f) ? "?" : text.substr(i, len));
    i += len;
  }
  std::string out;
  size_t keep = chars.size() <= limit ? chars.size() : limit - 3;
  for (size_t i = 0; i < keep; ++i) out += chars[i];
  return chars.size() <= limit ? out : out + "...";
}

InputFile::InputFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0 && errno != ENOENT) {
    throw input_error("input file " + path + " could not be opened (" + std::strerror(errno) + "); check its permissions");
  }
  struct stat info {};
  if (fd_ < 0 || fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    // Missing, a folder, a FIFO or a device: not a file to read (aotc_runtime's `is_file()` check).
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw input_error("input file " + path + " does not exist; pass .npy or .npz files with --input");
  }
  size_ = static_cast<uint64_t>(info.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool InputFile::read_at(uint64_t offset, void* out, size_t n) const {
  char* to = static_cast<char*>(out);
  while (n > 0) {
    ssize_t got = ::pread(fd_, to, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    to += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
  return true;
}

NpyStream::NpyStream(const ArraySource& source, std::string where) : source_(source), where_(std::move(where)) {
  if (!source.deflated) return;
  zs_ = std::make_unique<z_stream>();
  // Raw deflate (a zip entry carries no zlib header): negative window bits.
  if (inflateInit2(zs_.get(), -MAX_WBITS) != Z_OK) throw refused(source.label, "could not be inflated (zlib would not start)");
}

NpyStream::~NpyStream() {
  if (zs_) inflateEnd(zs_.get());
}

// More compressed bytes for inflate once it has used what it had, never past the entry's.
void NpyStream::refill() {
  z_stream& zs = *zs_;
  if (zs.avail_in != 0 || consumed_ >= source_.stored_size) return;
  input_.resize(static_cast<size_t>(std::min<uint64_t>(source_.stored_size - consumed_, 1 << 20)));
  if (!source_.file->read_at(source_.offset + consumed_, input_.data(), input_.size())) input_.clear();
  consumed_ = input_.empty() ? source_.stored_size : consumed_ + input_.size();  // a file cut short ends the input
  zs.next_in = reinterpret_cast<Bytef*>(input_.data());
  zs.avail_in = static_cast<uInt>(input_.size());
}

size_t NpyStream::inflate_some(char* out, size_t n) {
  z_stream& zs = *zs_;
  size_t produced = 0;
  while (produced < n && !ended_) {
    refill();
    uInt asked = static_cast<uInt>(std::min<size_t>(n - produced, size_t{1} << 30));
    zs.next_out = reinterpret_cast<Bytef*>(out + produced);
    zs.avail_out = asked;
    int rc = inflate(&zs, Z_NO_FLUSH);
    produced += asked - zs.avail_out;
    if (rc == Z_STREAM_END) ended_ = true;
    else if (rc == Z_BUF_ERROR && zs.avail_in == 0 && consumed_ >= source_.stored_size) break;  // the input ran out
    else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      // zlib.error's words, as aotc_runtime reports them
      throw refused(source_.label, "is not a readable .npz (error: Error " + std::to_string(rc) + " while decompressing data: " +
                                       shown_text(zs.msg ? zs.msg : "invalid data", 60) + "); save it with numpy.savez");
    }
  }
  return produced;
}

size_t NpyStream::read(char* out, size_t n) {
  n = static_cast<size_t>(std::min<uint64_t>(n, source_.size - produced_));
  size_t got = 0;
  if (source_.deflated) {
    got = inflate_some(out, n);
  } else {
    got = static_cast<size_t>(std::min<uint64_t>(n, source_.stored_size - consumed_));
    if (!source_.file->read_at(source_.offset + consumed_, out, got)) got = 0;  // a file cut short: truncated
    consumed_ += got;
  }
  produced_ += got;
  // zlib's crc32 takes uInt lengths: fed in pieces below 4 GiB.
  for (size_t at = 0; source_.check_crc && at < got; at += size_t{1} << 30) {
    uInt piece = static_cast<uInt>(std::min(got - at, size_t{1} << 30));
    crc_ = static_cast<uint32_t>(crc32(crc_, reinterpret_cast<const Bytef*>(out + at), piece));
  }
  return got;
}

bool NpyStream::at_end() {
  if (produced_ < source_.size) {
    char probe;
    if (read(&probe, 1) != 0) return false;
  }
  if (source_.check_crc && crc_ != source_.crc) {
    throw refused(source_.label, "is not a readable .npz (BadZipFile: Bad CRC-32 for file '" + shown_text(source_.entry, 60) +
                                     "'); save it with numpy.savez");
  }
  return true;
}

NpyHeader read_npy_header(NpyStream& stream, const std::string& where) {
  char start[8];
  read_exactly(stream, start, sizeof start, where);
  if (std::memcmp(start, "\x93NUMPY", 6) != 0) throw refused(where, "is not a .npy array (no \\x93NUMPY magic); save it with numpy.save");
  int major = static_cast<unsigned char>(start[6]), minor = static_cast<unsigned char>(start[7]);
  if (major < 1 || major > 3 || minor != 0) {
    throw refused(where, "has .npy format version " + std::to_string(major) + "." + std::to_string(minor) + "; versions 1.0 to 3.0 are read");
  }
  unsigned char field[4] = {0, 0, 0, 0};
  size_t field_size = major == 1 ? 2 : 4;
  read_exactly(stream, reinterpret_cast<char*>(field), field_size, where);
  uint64_t length = field[0] | (field[1] << 8) | (uint64_t{field[2]} << 16) | (uint64_t{field[3]} << 24);
  if (length > kMaxNpyHeader) {
    throw refused(where, "has a .npy header of " + std::to_string(length) + " bytes, above " + std::to_string(kMaxNpyHeader) +
                             "; save it with numpy.save");
  }
  std::string text(static_cast<size_t>(length), '\0');
  read_exactly(stream, text.data(), text.size(), where);
  // Format 3.0 differs from 2.0 only in a UTF-8 header, which only structured dtypes (refused) need.
  if (major == 3 && std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
    throw refused(where, "has a non-ASCII .npy header (a structured dtype); use " + kReadableDtypes + " arrays");
  }
  NpyHeader h;
  h.length = sizeof start + field_size + length;
  parse_fields(text, h, where);
  return h;
}

void check_plain_dtype(const NpyHeader& h, const std::string& where) {
  if (kPlain.count(h.dtype) == 0 && h.dtype.size() > 1 && h.dtype[0] == '>' && std::string("biuf").find(h.dtype[1]) != std::string::npos) {
    throw refused(where, "has dtype '" + h.dtype + "': big-endian data; save it little-endian (arr.astype(arr.dtype.newbyteorder('<')))");
  }
  if (h.dtype == "|O") throw refused(where, "has dtype object: not a plain array; use " + kReadableDtypes + " arrays");
  bool plain = std::any_of(kPlain.begin(), kPlain.end(), [&](const auto& item) { return item.second.name == h.dtype; });
  if (!plain) throw refused(where, "has dtype '" + h.dtype + "': use " + kReadableDtypes + " arrays");
}

at::Tensor read_npy_data(NpyStream& stream, const NpyHeader& h, const std::string& where) {
  std::vector<int64_t> stored = h.shape;
  if (h.fortran) std::reverse(stored.begin(), stored.end());
  at::Tensor tensor;
  try {
    tensor = at::empty(stored, at::TensorOptions().dtype(h.type));
  } catch (const std::exception&) {
    throw refused(where, "declares " + std::to_string(h.data_bytes) + " bytes of data, more than this machine can allocate");
  }
  char* data = static_cast<char*>(tensor.data_ptr());
  uint64_t filled = 0;
  while (filled < h.data_bytes) {
    size_t got = stream.read(data + filled, static_cast<size_t>(std::min<uint64_t>(h.data_bytes - filled, 1 << 20)));
    if (got == 0) {
      throw refused(where, "is truncated: its header declares " + std::to_string(h.data_bytes) + " bytes of data, it holds " +
                               std::to_string(filled) + "; save it again");
    }
    filled += got;
  }
  if (!stream.at_end()) {
    throw refused(where, "holds more data than its header declares (" + std::to_string(h.data_bytes) + " bytes); save it again");
  }
  if (h.fortran && stored.size() > 1) {
    std::vector<int64_t> order;
    for (int64_t i = static_cast<int64_t>(stored.size()) - 1; i >= 0; --i) order.push_back(i);
    tensor = tensor.permute(order).contiguous();
  }
  return tensor;
}

at::Tensor StoredArray::read() const {
  NpyStream stream(source, where);
  std::vector<char> skipped(static_cast<size_t>(header.length));  // read before; read again for the CRC
  if (stream.read(skipped.data(), skipped.size()) != skipped.size()) throw refused(where, "is truncated in its .npy header; save it again");
  return read_npy_data(stream, header, where);
}

StoredArray open_npy_file(const std::string& path) {
  StoredArray array;
  array.where = "input file " + path;
  array.source.file = std::make_shared<const InputFile>(path);
  array.source.stored_size = array.source.size = array.source.file->size();
  NpyStream stream(array.source, array.where);
  array.header = read_npy_header(stream, array.where);
  return array;
}

void check_npy_size(const StoredArray& array) {
  uint64_t size = array.source.file->size();
  if (size != array.header.total()) {
    throw refused(array.where, "holds " + std::to_string(size - array.header.length) + " bytes of data but its header declares " +
                                   std::to_string(array.header.data_bytes) + "; save it again with numpy.save");
  }
}

at::Tensor read_npy(const std::string& path) {
  StoredArray array = open_npy_file(path);
  check_plain_dtype(array.header, array.where);
  check_npy_size(array);
  return array.read();
}

void write_npz(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& arrays) {
  std::string out, directory;
  for (const auto& [name, tensor] : arrays) {
    std::string body = npy_bytes(tensor), entry = name + ".npy";
    uint32_t crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
    uint32_t offset = static_cast<uint32_t>(out.size());
    auto common = [&](std::string& s) {
      put16(s, 20); put16(s, 0); put16(s, 0); put16(s, 0); put16(s, 0x21);  // version, flags, stored, time, date
      put32(s, crc); put32(s, static_cast<uint32_t>(body.size())); put32(s, static_cast<uint32_t>(body.size()));
      put16(s, static_cast<uint16_t>(entry.size())); put16(s, 0);
    };
    put32(out, 0x04034b50);
    common(out);
    out += entry + body;
    put32(directory, 0x02014b50);
    put16(directory, 20);
    common(directory);
    put16(directory, 0); put16(directory, 0); put16(directory, 0); put32(directory, 0); put32(directory, offset);
    directory += entry;
  }
  uint32_t dir_offset = static_cast<uint32_t>(out.size());
  out += directory;
  put32(out, 0x06054b50);
  put16(out, 0); put16(out, 0);
  put16(out, static_cast<uint16_t>(arrays.size())); put16(out, static_cast<uint16_t>(arrays.size()));
  put32(out, static_cast<uint32_t>(directory.size())); put32(out, dir_offset); put16(out, 0);
  std::string tmp = path + ".tmp";
  {
    std::ofstream file(tmp, std::ios::binary);
    file.write(out.data(), static_cast<std::streamsize>(out.size()));
    if (!file) {
      std::remove(tmp.c_str());
      throw usage_error("output file " + path + " could not be written; check the folder exists and has space");
    }
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace aotc
