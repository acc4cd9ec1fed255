#include "core/sha256.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

#ifdef DZR_HAVE_OPENSSL
#include <openssl/evp.h>
#endif

namespace dzr {

namespace {

constexpr const char* kHex = "0123456789abcdef";

std::string to_hex(const unsigned char* md, size_t len) {
    std::string out(2 * len, '0');
    for (size_t i = 0; i < len; ++i) {
        out[2 * i] = kHex[md[i] >> 4];
        out[2 * i + 1] = kHex[md[i] & 15];
    }
    return out;
}

}  // namespace

// ---- the portable SHA-256 (FIPS 180-4), for builds without OpenSSL ---------------------------------------------

namespace detail {

/// Written from the standard's description: 64-byte blocks, a 64-word message schedule, 64 rounds.
class PortableSha256 {
public:
    void update(const unsigned char* p, size_t n) {
        total_ += n;
        if (fill_ > 0) {
            const size_t take = std::min(n, block_.size() - fill_);
            std::memcpy(block_.data() + fill_, p, take);
            fill_ += take, p += take, n -= take;
            if (fill_ < block_.size()) return;
            compress(block_.data());
            fill_ = 0;
        }
        for (; n >= 64; p += 64, n -= 64) compress(p);
        std::memcpy(block_.data(), p, n);
        fill_ = n;
    }

    std::array<unsigned char, 32> finish() {
        const uint64_t bits = total_ * 8;
        const unsigned char pad = 0x80;
        update(&pad, 1);
        const unsigned char zero = 0;
        while (fill_ != 56) update(&zero, 1);
        unsigned char len[8];
        for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
        update(len, 8);
        std::array<unsigned char, 32> md{};
        for (int i = 0; i < 8; ++i)
            for (int b = 0; b < 4; ++b) md[size_t(4 * i + b)] = static_cast<unsigned char>(h_[size_t(i)] >> (24 - 8 * b));
        return md;
    }

private:
    static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

    void compress(const unsigned char* p) {
        static constexpr uint32_t k[64] = {
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
            0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
            0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
            0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
            0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
            0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
            0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
            0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
        uint32_t w[64];
        for (int i = 0; i < 16; ++i)
            w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 |
                   uint32_t(p[4 * i + 3]);
        for (int i = 16; i < 64; ++i) {
            const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
        for (int i = 0; i < 64; ++i) {
            const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
            const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
        }
        h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
    }

    std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    std::array<unsigned char, 64> block_{};
    size_t fill_ = 0;
    uint64_t total_ = 0;
};

}  // namespace detail

std::string sha256_portable_hex(const void* data, size_t bytes) {
    detail::PortableSha256 h;
    h.update(static_cast<const unsigned char*>(data), bytes);
    const auto md = h.finish();
    return to_hex(md.data(), md.size());
}

bool sha256_uses_openssl() {
#ifdef DZR_HAVE_OPENSSL
    return true;
#else
    return false;
#endif
}

// ---- Sha256: OpenSSL's libcrypto when dzr was built with it (SHA extensions), else the portable one ---------------

#ifdef DZR_HAVE_OPENSSL

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
    return to_hex(md, len);
}

#else

struct Sha256::Impl {
    detail::PortableSha256 h;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {}

Sha256::~Sha256() = default;

void Sha256::update(const void* data, size_t bytes) { impl_->h.update(static_cast<const unsigned char*>(data), bytes); }

std::string Sha256::hex_digest() {
    const auto md = impl_->h.finish();
    return to_hex(md.data(), md.size());
}

#endif

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
