// The bits of dzr's own attention kernels (kernels/attention.cu: flash over a paged history; kernels/
// attention_memeff.cu: PyTorch's memory-efficient order) on fixed inputs, written to a file, so that two revisions of
// the kernels can be compared byte for byte (a refactor must not move a bit; scripts/bench/attn_bits.sh).
// Linked with the kernel objects of one revision (scripts/bench/attn_bits.sh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/attention_memeff.cuh"

namespace {

using dzr::DType;

/// A device buffer of n 16-bit values hashed from (seed, index): spread over about [-2, 2].
void* random16(size_t n, uint32_t seed, DType dtype) {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) {
        uint32_t x = uint32_t(i) * 2654435761u ^ (seed * 0x9e3779b9u);
        x ^= x >> 15, x *= 0x2c1b3c6du, x ^= x >> 12;
        const float f = (float(x % 40001u) / 10000.0f) - 2.0f;
        h[i] = dtype == DType::BF16 ? __bfloat16_as_ushort(__float2bfloat16(f)) : __half_as_ushort(__float2half(f));
    }
    void* d = nullptr;
    cudaMalloc(&d, n * 2);
    cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice);
    return d;
}

bool dump(FILE* f, const void* d, size_t bytes) {
    std::vector<unsigned char> h(bytes);
    if (cudaDeviceSynchronize() != cudaSuccess) return false;
    cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost);
    return std::fwrite(h.data(), 1, bytes, f) == bytes;
}

bool flash_case(FILE* f, DType dt, int hd, int heads, int64_t lq, int64_t hist, int64_t cur) {
    namespace k = dzr::kernels;
    const int bs = 16;
    const int64_t blocks = (hist + bs - 1) / bs + 1;
    std::vector<int32_t> table(static_cast<size_t>(blocks), 0);
    for (int64_t b = 0; b < blocks; ++b) table[size_t(b)] = int32_t((b * 7 + 3) % blocks);  // a permutation
    int32_t* dtable = nullptr;
    cudaMalloc(&dtable, table.size() * 4);
    cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
    k::FlashAttentionArgs a;
    a.dtype = dt, a.head_dim = hd, a.heads = heads, a.lq = lq, a.scale = 0.0884f;
    a.q = random16(size_t(lq * heads * hd), 1, dt), a.q_tok = heads * hd, a.q_head = hd;
    void* out = random16(size_t(lq * heads * hd), 9, dt);
    a.out = out, a.o_tok = heads * hd, a.o_head = hd;
    a.hist_k = random16(size_t(blocks * bs * heads * hd), 2, dt);
    a.hist_v = random16(size_t(blocks * bs * heads * hd), 3, dt);
    a.hist_tok = heads * hd, a.hist_head = hd, a.block_size = bs, a.table = dtable, a.hist_len = hist;
    a.k = random16(size_t(cur * heads * hd + 8), 4, dt), a.v = random16(size_t(cur * heads * hd + 8), 5, dt);
    a.k_tok = a.v_tok = heads * hd, a.k_head = a.v_head = hd, a.cur_len = cur;
    if (k::flash_attention(a, nullptr) != cudaSuccess) return false;
    return dump(f, out, size_t(lq * heads * hd * 2));
}

bool memeff_case(FILE* f, DType dt, int d, int heads, int64_t lq, int64_t lk) {
    namespace k = dzr::kernels;
    k::MemEffAttentionArgs a;
    a.dtype = dt, a.heads = heads, a.lq = lq, a.lk = lk, a.d = d, a.dv = d, a.scale = 0.051f;
    a.q = random16(size_t(lq * heads * d), 11, dt), a.q_tok = heads * d, a.q_head = d;
    a.k = random16(size_t(lk * heads * d), 12, dt), a.k_tok = heads * d, a.k_head = d;
    a.v = random16(size_t(lk * heads * d), 13, dt), a.v_tok = heads * d, a.v_head = d;
    void* out = random16(size_t(lq * heads * d), 14, dt);
    a.out = out, a.o_tok = heads * d, a.o_head = d;
    if (k::mem_eff_attention(a, nullptr) != cudaSuccess) return false;
    return dump(f, out, size_t(lq * heads * d * 2));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    FILE* f = std::fopen(argv[1], "wb");
    if (!f) return 2;
    bool ok = true;
    for (DType dt : {DType::BF16, DType::F16}) {
        ok = ok && flash_case(f, dt, 128, 3, 200, 300, 70) && flash_case(f, dt, 64, 2, 65, 0, 129) &&
             flash_case(f, dt, 128, 2, 1, 1000, 0);
        ok = ok && memeff_case(f, dt, 384, 1, 1050, 1050) && memeff_case(f, dt, 160, 3, 70, 300) &&
             memeff_case(f, dt, 512, 1, 33, 129);
    }
    std::fclose(f);
    std::printf("%s\n", ok ? "ok" : "a kernel failed");
    return ok ? 0 : 1;
}
