// The .npy format (numpy.lib.format, NEP 1) and the zip container numpy.savez writes, for stored
// entries only. Reading goes through explicit checks of every header field before any allocation,
// so a hostile file is refused, not trusted. Zip: the subset numpy writes by default (no
// compression, no zip64) is a few dozen lines; zlib provides the CRC-32.
#include "aotc/npy.h"

#include <ATen/ATen.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "aotc/error.h"

namespace aotc {
namespace {

constexpr size_t kMaxHeader = 1 << 16;  // numpy's own limit for a header it will read safely

struct Dtype {
  at::ScalarType type;
  std::string descr;  // as written: '<f4', '|u1', ...
};

const std::map<std::string, at::ScalarType> kReadable = {
    {"<f2", at::kHalf}, {"<f4", at::kFloat}, {"<f8", at::kDouble}, {"|i1", at::kChar},  {"<i2", at::kShort},
    {"<i4", at::kInt},  {"<i8", at::kLong},  {"|u1", at::kByte},   {"|b1", at::kBool},  {"<u1", at::kByte},
    {"<i1", at::kChar}, {"<b1", at::kBool}};

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

// Input files the runner cannot read are input errors (exit 8), as in the Python runtime.
Error bad(const std::string& where, const std::string& problem) {
  return input_error("input file " + where + " " + problem);
}

// Parse one .npy held in memory; `where` names it in errors.
at::Tensor parse_npy(const std::string& where, const char* data, size_t size) {
  if (size < 10 || std::memcmp(data, "\x93NUMPY", 6) != 0) throw bad(where, "is not a .npy file (no \\x93NUMPY magic)");
  int major = static_cast<unsigned char>(data[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<unsigned char>(data[8]) | (static_cast<unsigned char>(data[9]) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) throw bad(where, "is truncated");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<unsigned char>(data[8 + i])) << (8 * i);
    offset = 12;
  } else {
    throw bad(where, "has .npy format version " + std::to_string(major) + "; versions 1 to 3 are supported");
  }
  if (header_len > kMaxHeader || offset + header_len > size) throw bad(where, "has a header longer than the file or than 64 KiB");
  std::string header(data + offset, header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([^']*)')"))) throw bad(where, "has no 'descr' in its header");
  std::string descr = m[1];
  auto known = kReadable.find(descr);
  if (known == kReadable.end()) {
    std::string why = descr.size() && descr[0] == '>' ? "big-endian data; save it little-endian (arr.astype(arr.dtype.newbyteorder('<')))"
                                                      : "a dtype the runner does not read; use float16/32/64, int8/16/32/64, uint8 or bool";
    throw bad(where, "has dtype '" + descr + "': " + why);
  }
  if (!std::regex_search(header, m, std::regex(R"('fortran_order'\s*:\s*(True|False))"))) throw bad(where, "has no 'fortran_order'");
  bool fortran = m[1] == "True";
  if (!std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))"))) throw bad(where, "has no 'shape'");
  std::vector<int64_t> shape;
  std::stringstream dims(m[1].str());
  std::string item;
  size_t numel = 1;
  while (std::getline(dims, item, ',')) {
    item.erase(0, item.find_first_not_of(" "));
    item.erase(item.find_last_not_of(" ") + 1);
    if (item.empty()) continue;
    if (item.find_first_not_of("0123456789") != std::string::npos || item.size() > 12) throw bad(where, "has a shape that is not a tuple of sizes");
    int64_t dim = std::stoll(item);
    shape.push_back(dim);
    numel *= static_cast<size_t>(dim);
  }
  size_t itemsize = c10::elementSize(known->second);
  size_t need = numel * itemsize;
  if (numel != 0 && need / numel != itemsize) throw bad(where, "declares more data than can exist");
  if (offset + header_len + need > size) {
    throw bad(where, "is truncated: its header declares " + std::to_string(need) + " bytes of data, the file holds " +
                         std::to_string(size - offset - header_len));
  }
  std::vector<int64_t> stored = shape;
  if (fortran) std::reverse(stored.begin(), stored.end());
  at::Tensor tensor = at::empty(stored, at::TensorOptions().dtype(known->second));
  std::memcpy(tensor.data_ptr(), data + offset + header_len, need);
  if (fortran && stored.size() > 1) {
    std::vector<int64_t> order;
    for (int64_t i = static_cast<int64_t>(stored.size()) - 1; i >= 0; --i) order.push_back(i);
    tensor = tensor.permute(order).contiguous();
  }
  return tensor;
}

std::string read_file(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw input_error("input file " + path + " does not exist; pass .npy or .npz files with --input");
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

uint32_t u32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}
uint16_t u16(const std::string& s, size_t at) {
  return static_cast<uint16_t>(static_cast<unsigned char>(s[at]) | (static_cast<unsigned char>(s[at + 1]) << 8));
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

}  // namespace

at::Tensor read_npy(const std::string& path) {
  std::string data = read_file(path);
  return parse_npy(path, data.data(), data.size());
}

std::vector<std::pair<std::string, at::Tensor>> read_npz(const std::string& path) {
  std::string data = read_file(path);
  // End of central directory: the last 22 bytes plus a comment of at most 64 KiB.
  size_t eocd = std::string::npos;
  if (data.size() >= 22) {
    size_t lowest = data.size() > 22 + 65535 ? data.size() - 22 - 65535 : 0;
    for (size_t i = data.size() - 22 + 1; i-- > lowest;) {
      if (u32(data, i) == 0x06054b50) {
        eocd = i;
        break;
      }
    }
  }
  if (eocd == std::string::npos) throw bad(path, "is not a .npz (zip) archive");
  size_t count = u16(data, eocd + 10), dir = u32(data, eocd + 16);
  std::vector<std::pair<std::string, at::Tensor>> arrays;
  for (size_t n = 0, at = dir; n < count; ++n) {
    if (at + 46 > data.size() || u32(data, at) != 0x02014b50) throw bad(path, "has a damaged zip directory");
    uint16_t method = u16(data, at + 10);
    uint32_t size = u32(data, at + 20), name_len = u16(data, at + 28), extra = u16(data, at + 30), comment = u16(data, at + 32);
    uint32_t local = u32(data, at + 42);
    std::string name = data.substr(at + 46, name_len);
    if (method != 0) throw bad(path, "has compressed entries (numpy.savez_compressed); save it with numpy.savez");
    if (size == 0xffffffff || local == 0xffffffff) throw bad(path, "is a zip64 archive (over 4 GB); the runner reads numpy.savez archives under 4 GB");
    if (local + 30 > data.size() || u32(data, local) != 0x04034b50) throw bad(path, "has a damaged zip entry " + name);
    size_t start = local + 30 + u16(data, local + 26) + u16(data, local + 28);
    if (start + size > data.size()) throw bad(path, "is truncated in entry " + name);
    std::string key = name.size() > 4 && name.substr(name.size() - 4) == ".npy" ? name.substr(0, name.size() - 4) : name;
    arrays.emplace_back(key, parse_npy(path + ":" + name, data.data() + start, size));
    at += 46 + name_len + extra + comment;
  }
  return arrays;
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
