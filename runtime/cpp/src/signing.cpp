#include "aotc/signing.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/pem.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "aotc/error.h"
#include "aotc/manifest.h"
#include "small_file.h"

namespace aotc {
namespace {

constexpr size_t kSignatureBytes = 64;     // an ed25519 signature
constexpr size_t kMaxKeyBytes = 64 << 10;  // an ed25519 PEM key is about 120 bytes; read no more than this
const std::string kKeygenHint = "make a key pair with `aotc keygen --private-key KEY.pem --public-key KEY.pub.pem`";

std::string sign_hint(const std::string& folder) { return "sign it with `aotc sign " + folder + " --key PRIVATE_KEY.pem`"; }

// Why a small file could not be read, as Python's OSError.strerror names it.
std::string unreadable(const SmallFile& file) {
  return file.status == SmallFile::Status::not_regular ? "not a regular file" : std::strerror(file.error);
}

using Key = std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)>;

// What the Python runtime calls a key of another algorithm: the name of cryptography's class.
std::string key_kind(const EVP_PKEY* key) {
  switch (EVP_PKEY_get_base_id(key)) {
    case EVP_PKEY_RSA:
    case EVP_PKEY_RSA_PSS: return "RSAPublicKey";
    case EVP_PKEY_EC: return "ECPublicKey";
    case EVP_PKEY_DSA: return "DSAPublicKey";
    case EVP_PKEY_DH:
    case EVP_PKEY_DHX: return "DHPublicKey";
    case EVP_PKEY_ED448: return "Ed448PublicKey";
    case EVP_PKEY_X25519: return "X25519PublicKey";
    case EVP_PKEY_X448: return "X448PublicKey";
    default: {
      const char* name = OBJ_nid2sn(EVP_PKEY_get_base_id(key));
      return name ? name : "unknown";
    }
  }
}

Key public_key(const std::string& path) {
  SmallFile file = read_small_file(path, kMaxKeyBytes);
  if (file.status == SmallFile::Status::too_large) {
    throw package_error("public key " + path + " is larger than 64 KiB, so not a PEM ed25519 key; " + kKeygenHint);
  }
  if (!file.ok()) {
    throw package_error("public key " + path + " cannot be read (" + unreadable(file) + "); pass the PEM file `aotc keygen` wrote, or " +
                        kKeygenHint);
  }
  std::unique_ptr<BIO, int (*)(BIO*)> bio(BIO_new_mem_buf(file.bytes.data(), static_cast<int>(file.bytes.size())), &BIO_free);
  Key key(bio ? PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr) : nullptr, &EVP_PKEY_free);
  ERR_clear_error();  // a failed PEM parse leaves its reasons queued: they are not this process's later errors
  if (!key) {
    std::string hint = file.bytes.find("PRIVATE KEY-----") != std::string::npos
                           ? " (it is a private key: pass the public key that `aotc keygen --public-key` wrote)"
                           : "";
    throw package_error("public key " + path + " is not a PEM public key" + hint + "; " + kKeygenHint);
  }
  if (EVP_PKEY_get_base_id(key.get()) != EVP_PKEY_ED25519) {
    throw package_error("public key " + path + " is not an Ed25519 key (" + key_kind(key.get()) + "); aotc signs with ed25519: " +
                        kKeygenHint);
  }
  return key;
}

std::string signature_bytes(const std::string& folder) {
  std::string path = (std::filesystem::path(folder) / kSignatureFile).string();
  // Non-blocking and regular files only: a FIFO in place of manifest.json.sig is refused, not waited on.
  SmallFile file = read_small_file(path, kSignatureBytes);
  switch (file.status) {
    case SmallFile::Status::missing:
      throw package_error("package " + folder + " is not signed (it has no " + kSignatureFile + "); " + sign_hint(folder));
    case SmallFile::Status::not_regular:
    case SmallFile::Status::unreadable:
      throw package_error(path + " cannot be read (" + unreadable(file) + "); " + sign_hint(folder));
    case SmallFile::Status::too_large:
      throw package_error(path + " is larger, not a 64-byte ed25519 signature; " + sign_hint(folder));
    case SmallFile::Status::ok:
      break;
  }
  if (file.bytes.size() != kSignatureBytes) {
    throw package_error(path + " is " + std::to_string(file.bytes.size()) + " bytes, not a 64-byte ed25519 signature; " +
                        sign_hint(folder));
  }
  return file.bytes;
}

}  // namespace

std::string verify_signature(const std::string& folder, const std::string& public_key_path) {
  // The order of verify_signature in signing.py, so both runtimes name the same first problem.
  std::string manifest = read_manifest_bytes(folder);
  Key key = public_key(public_key_path);
  std::string signature = signature_bytes(folder);
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  // Ed25519 signs the message itself (no separate digest): EVP_DigestVerify in one shot, no md.
  bool valid = ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) == 1 &&
               EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                                reinterpret_cast<const unsigned char*>(manifest.data()), manifest.size()) == 1;
  ERR_clear_error();
  if (!valid) {
    throw package_error("package " + folder + " fails its signature check against " + public_key_path + ": its " + kManifestName +
                        " was changed after it was signed, or signed by another key; get the package again from "
                        "whoever signed it, or pass the public key of the key that signed it");
  }
  return manifest;
}

}  // namespace aotc
