#include "aotc/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "aotc/error.h"

namespace aotc {

namespace {

using Context = std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)>;

Context new_context() {
  Context ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  return ctx;
}

std::string hex_digest(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx, digest, &length);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

}  // namespace

std::string sha256_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw package_error("package file " + path + " could not be read; rebuild the package with `aotc build --force`");
  Context ctx = new_context();
  std::vector<unsigned char> block(1 << 20);
  size_t n;
  while ((n = std::fread(block.data(), 1, block.size(), file.get())) > 0) EVP_DigestUpdate(ctx.get(), block.data(), n);
  return hex_digest(ctx.get());
}

std::string sha256_hex(const std::string& bytes) {
  Context ctx = new_context();
  EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size());
  return hex_digest(ctx.get());
}

}  // namespace aotc
