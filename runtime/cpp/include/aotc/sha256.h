// sha256 of a file, as hex: the hashes manifest.json records for every package file.
#pragma once

#include <string>

namespace aotc {

// Hex sha256 of the file at `path` (OpenSSL's libcrypto: present on every Linux serving machine).
std::string sha256_file(const std::string& path);

}  // namespace aotc
