#pragma once
/// SHA-256 (through OpenSSL's libcrypto when dzr is built with it, else a portable implementation): checkpoint
/// checksums (`dzr ckpt make` writes checksums.sha256,
/// `dzr ckpt validate --hash` checks it) and the run fingerprint's shard-header hashes.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

namespace dzr {

/// An incremental SHA-256.
class Sha256 {
  public:
    Sha256();
    ~Sha256();
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;

    void update(const void* data, size_t bytes);
    void update(std::string_view text) { update(text.data(), text.size()); }
    /// The digest as 64 lowercase hex digits; the object is spent afterwards.
    std::string hex_digest();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// SHA-256 of `bytes`, as 64 lowercase hex digits.
std::string sha256_hex(const void* data, size_t bytes);
inline std::string sha256_hex(std::string_view text) {
    return sha256_hex(text.data(), text.size());
}

/// The portable implementation's SHA-256 of `bytes` (what Sha256 uses without OpenSSL), for tests.
std::string sha256_portable_hex(const void* data, size_t bytes);
/// True when Sha256 goes through OpenSSL.
bool sha256_uses_openssl();

/// SHA-256 of a whole file (read in chunks). Throws dzr::Error naming the file when it cannot be read.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace dzr
