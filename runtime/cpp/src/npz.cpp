// numpy's .npz container: a zip of .npy entries, stored (numpy.savez) or deflated
// (numpy.savez_compressed), read with the rules and messages of aotc_runtime/npz.py. The end
// record's numbers (entry count, the directory's place and size) are checked before the directory
// is read; each entry's local header against the directory; an entry's .npy header before its data.
#include <algorithm>

#include "aotc/npy.h"
#include "npy_format.h"

namespace aotc {
namespace {

constexpr uint32_t kEndRecord = 0x06054b50, kDirectoryEntry = 0x02014b50, kLocalHeader = 0x04034b50, kZip64Locator = 0x07064b50;
constexpr size_t kEndSize = 22, kMaxComment = 65535, kDirectoryEntrySize = 46, kLocalHeaderSize = 30;
// A directory entry is 46 bytes plus its name, extra fields and comment. numpy.savez writes names
// of input-name length and no extras; 4 KiB leaves room for other writers' timestamps. Without this
// bound, a directory claiming one entry could hold thousands (npz.py's MAX_DIRECTORY_ENTRY).
constexpr uint64_t kMaxDirectoryEntry = kDirectoryEntrySize + 4096;
constexpr uint16_t kStored = 0, kDeflated = 8;
const std::string kSaveNpz = "save it with numpy.savez";

uint32_t u32(const char* s) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(s[i])) << (8 * i);
  return v;
}
uint16_t u16(const char* s) { return static_cast<uint16_t>(static_cast<unsigned char>(s[0]) | (static_cast<unsigned char>(s[1]) << 8)); }

Error refused(const std::string& label, const std::string& problem) { return input_error(label + " " + problem); }

// zipfile's refusal of a damaged archive, in the words aotc_runtime passes on.
Error damaged(const std::string& label, const std::string& why) {
  return refused(label, "is not a readable .npz (BadZipFile: " + why + "); " + kSaveNpz);
}

struct EndRecord {
  uint16_t count = 0;
  uint64_t directory_at = 0, directory_size = 0;
};

EndRecord end_record(const InputFile& file, const std::string& label, size_t most, const std::string& expected) {
  // The record is the last 22 bytes, unless a comment (at most 64 KiB) follows it.
  uint64_t size = file.size();
  uint64_t tail_start = size > kEndSize + kMaxComment ? size - kEndSize - kMaxComment : 0;
  std::vector<char> tail(static_cast<size_t>(size - tail_start));
  if (!file.read_at(tail_start, tail.data(), tail.size())) throw refused(label, "could not be read; save it again");
  // The last signature with a whole record after its first byte.
  size_t at = std::string::npos;
  for (size_t i = tail.size() >= kEndSize ? tail.size() - kEndSize + 1 : 0; i-- > 0;) {
    if (u32(tail.data() + i) == kEndRecord) {
      at = i;
      break;
    }
  }
  if (at == std::string::npos) throw refused(label, "is not a readable .npz (no zip end record); " + kSaveNpz);
  const char* r = tail.data() + at;
  uint16_t disk = u16(r + 4), directory_disk = u16(r + 6), on_disk = u16(r + 8), count = u16(r + 10), comment = u16(r + 20);
  uint32_t directory_size = u32(r + 12), directory_at = u32(r + 16);
  uint64_t record_at = tail_start + at;
  if (at + kEndSize + comment != tail.size()) throw refused(label, "has bytes after its zip end record; " + kSaveNpz);
  char locator[4];
  bool zip64 = record_at >= 20 && file.read_at(record_at - 20, locator, 4) && u32(locator) == kZip64Locator;
  if (zip64 || count == 0xffff || on_disk == 0xffff || directory_size == 0xffffffff || directory_at == 0xffffffff) {
    throw refused(label, "is a zip64 archive (over 4 GiB or 65,535 entries), which is not read; send smaller inputs");
  }
  if (disk != 0 || directory_disk != 0 || on_disk != count) throw refused(label, "is a multi-disk zip archive; " + kSaveNpz);
  // Before the directory is read: a 40,000-entry archive is refused for a package of two inputs.
  if (count > most) throw refused(label, "holds " + std::to_string(count) + " entries; " + expected + ": save one array per input");
  if (uint64_t{directory_at} + directory_size != record_at) {
    throw refused(label, "has its zip directory where its end record does not place it; " + kSaveNpz);
  }
  if (directory_size > count * kMaxDirectoryEntry) {
    throw refused(label, "has a zip directory of " + std::to_string(directory_size) + " bytes for " + std::to_string(count) +
                             " entries; " + kSaveNpz);
  }
  return {count, directory_at, directory_size};
}

}  // namespace

ZipDirectory read_zip_directory(const std::string& path, const std::string& label, size_t most, const std::string& expected) {
  ZipDirectory zip;
  zip.file = std::make_shared<const InputFile>(path);
  EndRecord end = end_record(*zip.file, label, most, expected);
  zip.directory_at = end.directory_at;
  std::vector<char> bytes(static_cast<size_t>(end.directory_size));  // at most 4 KiB per entry, checked above
  if (!zip.file->read_at(end.directory_at, bytes.data(), bytes.size())) throw refused(label, "could not be read; save it again");
  // As zipfile does: entries until the directory's bytes are used up, then their count compared.
  for (size_t at = 0; at < bytes.size();) {
    const char* d = bytes.data() + at;
    if (at + kDirectoryEntrySize > bytes.size() || u32(d) != kDirectoryEntry) throw damaged(label, "Bad magic number for central directory");
    size_t name_len = u16(d + 28), extra = u16(d + 30), comment = u16(d + 32);
    if (at + kDirectoryEntrySize + name_len + extra + comment > bytes.size()) throw damaged(label, "Truncated central directory");
    ZipEntry e;
    e.flags = u16(d + 8);
    e.method = u16(d + 10);
    e.crc = u32(d + 16);
    e.compressed = u32(d + 20);
    e.size = u32(d + 24);
    e.local = u32(d + 42);
    e.name.assign(d + kDirectoryEntrySize, name_len);
    if (e.compressed == 0xffffffff || e.size == 0xffffffff || e.local == 0xffffffff) {
      throw refused(label, "is a zip64 archive (over 4 GiB or 65,535 entries), which is not read; send smaller inputs");
    }
    zip.entries.push_back(std::move(e));
    at += kDirectoryEntrySize + name_len + extra + comment;
  }
  if (zip.entries.size() != end.count) {
    throw refused(label, "lists " + std::to_string(zip.entries.size()) + " entries in its zip directory but " + std::to_string(end.count) +
                             " in its end record; save it again with numpy.savez");
  }
  return zip;
}

StoredArray open_entry(const ZipDirectory& zip, const ZipEntry& e, const std::string& where, const std::string& label) {
  if (e.flags & 1) throw refused(where, "is encrypted; " + kSaveNpz);
  if (e.method != kStored && e.method != kDeflated) {
    throw refused(where, "is compressed with zip method " + std::to_string(e.method) + "; save it with numpy.savez or numpy.savez_compressed");
  }
  char local[kLocalHeaderSize];
  if (!zip.file->read_at(e.local, local, sizeof local)) throw damaged(label, "Truncated file header");
  if (u32(local) != kLocalHeader) throw damaged(label, "Bad magic number for file header");
  size_t name_len = u16(local + 26), extra = u16(local + 28);
  std::string name(name_len, '\0');
  if (!zip.file->read_at(e.local + kLocalHeaderSize, name.data(), name.size()) || name != e.name) {
    throw damaged(label, "File name in directory '" + shown_text(e.name, 60) + "' and header '" + shown_text(name, 60) + "' differ.");
  }
  StoredArray array;
  array.where = where;
  ArraySource& s = array.source;
  s.file = zip.file;
  s.offset = e.local + kLocalHeaderSize + name_len + extra;
  s.stored_size = e.compressed;
  s.size = e.size;
  s.deflated = e.method == kDeflated;
  s.check_crc = true;
  s.crc = e.crc;
  s.label = label;
  s.entry = e.name;
  // Its bytes lie between its local header and the directory: no entry reads another's or the directory.
  if (s.offset > zip.directory_at || s.stored_size > zip.directory_at - s.offset) {
    throw refused(where, "runs into the zip directory (its sizes are wrong); save it again with numpy.savez");
  }
  // The header only: inflate is asked for at most the header's bytes here.
  NpyStream stream(s, where);
  array.header = read_npy_header(stream, where);
  return array;
}

void check_entry_size(const StoredArray& array, const ZipEntry& e) {
  if (e.size != array.header.total()) {
    throw refused(array.where, "is " + std::to_string(e.size) + " bytes unpacked but its .npy header describes " +
                                   (array.header.total() == UINT64_MAX ? std::string("more") : std::to_string(array.header.total())) +
                                   "; save it again with numpy.savez");
  }
}

std::vector<std::pair<std::string, at::Tensor>> read_npz(const std::string& path) {
  std::string label = "input file " + path;
  ZipDirectory zip = read_zip_directory(path, label, 0xfffe, "");
  std::vector<std::pair<std::string, at::Tensor>> arrays;
  for (const auto& e : zip.entries) {
    std::string where = label + " entry " + shown_text(e.name);
    StoredArray array = open_entry(zip, e, where, label);
    check_plain_dtype(array.header, where);
    check_entry_size(array, e);
    bool npy = e.name.size() > 4 && e.name.compare(e.name.size() - 4, 4, ".npy") == 0;
    arrays.emplace_back(npy ? e.name.substr(0, e.name.size() - 4) : e.name, array.read());
  }
  return arrays;
}

}  // namespace aotc
