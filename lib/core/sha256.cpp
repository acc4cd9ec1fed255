#include "core/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace dzr {

struct Sha256::Impl {
    EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
    impl_->ctx = EVP_MD_CTX_new();
    DZR_CHECK(impl_->ctx != nullptr && EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) == 1,
              "sha256: OpenSSL cannot start a digest");
}

Sha256::~Sha256() {
    if (impl_ && impl_->ctx) EVP_MD_CTX_free(impl_->ctx);
}

void Sha256::update(const void* data, size_t bytes) {
    DZR_CHECK(EVP_DigestUpdate(impl_->ctx, data, bytes) == 1, "sha256: OpenSSL digest update failed");
}

std::string Sha256::hex_digest() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    DZR_CHECK(EVP_DigestFinal_ex(impl_->ctx, md, &len) == 1 && len == 32, "sha256: OpenSSL digest failed");
    static const char* kHex = "0123456789abcdef";
    std::string out(64, '0');
    for (unsigned int i = 0; i < len; ++i) {
        out[2 * i] = kHex[md[i] >> 4];
        out[2 * i + 1] = kHex[md[i] & 15];
    }
    return out;
}

std::string sha256_hex(const void* data, size_t bytes) {
    Sha256 h;
    h.update(data, bytes);
    return h.hex_digest();
}

std::string sha256_file(const std::filesystem::path& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    DZR_CHECK(f != nullptr, "cannot open {}: {}", path.string(), std::strerror(errno));
    Sha256 h;
    std::vector<char> buf(size_t(1) << 20);
    for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f)) > 0;) h.update(buf.data(), n);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    DZR_CHECK(!failed, "cannot read {}: {}", path.string(), std::strerror(errno));
    return h.hex_digest();
}

}  // namespace dzr
