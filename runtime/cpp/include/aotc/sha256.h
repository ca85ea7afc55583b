// sha256 of a file, as hex: the hashes manifest.json records for every package file.
#pragma once

#include <string>

namespace aotc {

// Hex sha256 of the file at `path` (OpenSSL's libcrypto: present on every Linux serving machine).
std::string sha256_file(const std::string& path);

// Hex sha256 of bytes in memory (the manifest's hash of its own text).
std::string sha256_hex(const std::string& bytes);

}  // namespace aotc
