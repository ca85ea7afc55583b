// Package signatures (`aotc sign`), checked with no Python: ed25519 over manifest.json's exact
// bytes, the raw 64-byte signature in manifest.json.sig, the public key in PEM
// (SubjectPublicKeyInfo, as `aotc keygen` writes it). The same checks, order, messages and exit
// code (7) as aotc_runtime/signing.py, with OpenSSL's libcrypto.
#pragma once

#include <string>

namespace aotc {

// Refuse (aotc::Error, exit 7) a package that is unsigned, or whose manifest.json is not what the
// holder of PUBLIC_KEY_PATH's private key signed. Returns the manifest bytes that were verified:
// parse those (parse_manifest), never a second read of the file. The other files are vouched for
// only once verify_files has checked them against this manifest (Package::load does both).
std::string verify_signature(const std::string& folder, const std::string& public_key_path);

}  // namespace aotc
