// The cuBLASLt settings the parity work at the real widths varies (CudaBackendOptions::lt_workspace_bytes,
// lt_alignment; DZR_LT_WORKSPACE, DZR_LT_ALIGN): under each, a biased GEMM of the DiT head's shape (N = 64, K = 5120,
// where the heuristic may split K) still computes x·Wᵀ + b (checked against the host in double), switching the
// settings back gives the first result bit for bit (the cached plans are rebuilt), and a workspace larger than the
// buffer is refused.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "support/test_support.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

namespace {

constexpr int64_t kM = 880, kK = 5120, kN = 64;

struct Operands {
    std::vector<float> x, w, b;  // bf16-exact values: x [M, K], w [N, K], b [N]
};

Operands make_operands() {
    Operands o;
    std::mt19937_64 rng(2026);
    std::normal_distribution<float> n(0.f, 1.f);
    const auto bf = [](float v) { return bf16_to_f32(f32_to_bf16(v)); };
    o.x.resize(size_t(kM * kK));
    o.w.resize(size_t(kN * kK));
    o.b.resize(size_t(kN));
    for (float& v : o.x) v = bf(n(rng));
    for (float& v : o.w) v = bf(n(rng) / std::sqrt(float(kK)));
    for (float& v : o.b) v = bf(0.1f * n(rng));
    return o;
}

Tensor to_device(Backend& be, const std::vector<float>& v, const Shape& shape) {
    Tensor host = Tensor::host_f32(shape, v);
    Tensor d = be.alloc(shape, DType::BF16);
    be.upload(host.view(), d.view());
    return d;
}

/// x·Wᵀ + b on the device (bf16 in and out) as float.
std::vector<float> run(Backend& be, const Operands& o) {
    const Tensor x = to_device(be, o.x, Shape{kM, kK}), w = to_device(be, o.w, Shape{kN, kK}),
                 b = to_device(be, o.b, Shape{kN});
    Tensor out = be.alloc({kM, kN}, DType::BF16);
    be.linear(x, w, b, out);
    Tensor host = Tensor::host(Shape{kM, kN}, DType::F32);
    be.download(out, host.view());
    return std::vector<float>(host.ptr<float>(), host.ptr<float>() + host.numel());
}

/// max |got − ref| over the rms of ref, ref in double on the host.
double rel_err(const Operands& o, const std::vector<float>& got) {
    double err = 0, sq = 0;
    for (int64_t i = 0; i < kM; ++i)
        for (int64_t j = 0; j < kN; ++j) {
            double acc = o.b[size_t(j)];
            for (int64_t k = 0; k < kK; ++k) acc += double(o.x[size_t(i * kK + k)]) * o.w[size_t(j * kK + k)];
            err = std::max(err, std::abs(double(got[size_t(i * kN + j)]) - acc));
            sq += acc * acc;
        }
    return err / std::sqrt(sq / double(kM * kN));
}

}  // namespace

TEST_CASE("a head-shaped GEMM is right under every cuBLASLt workspace and alignment setting") {
    const Operands o = make_operands();
    std::unique_ptr<Backend> be = make_cuda_backend(0, size_t(256) << 20);
    const CudaBackendOptions base = be->cuda_options();
    const std::vector<float> first = run(*be, o);
    CHECK(rel_err(o, first) < 2e-2);  // bf16 output: half an ulp is 2^-9 of the value
    for (size_t ws : {size_t(1) << 20, size_t(0), kMaxLtWorkspaceBytes}) {
        for (LtAlignment al : {LtAlignment::Dzr, LtAlignment::Torch}) {
            CAPTURE(ws);
            CAPTURE(int(al));
            CudaBackendOptions co = base;
            co.lt_workspace_bytes = ws;
            co.lt_alignment = al;
            be->set_cuda_options(co);
            CHECK(rel_err(o, run(*be, o)) < 2e-2);
        }
    }
    be->set_cuda_options(base);
    CHECK(run(*be, o) == first);
}

TEST_CASE("a cuBLASLt workspace larger than the allocated buffer is refused") {
    std::unique_ptr<Backend> be = make_cuda_backend(0, size_t(64) << 20);
    CudaBackendOptions co = be->cuda_options();
    co.lt_workspace_bytes = kMaxLtWorkspaceBytes + 1;
    CHECK(test::contains(test::error_of([&] { be->set_cuda_options(co); }), "exceeds"));
    BackendOptions bo;
    bo.cuda.lt_workspace_bytes = kMaxLtWorkspaceBytes + 1;
    CHECK(test::contains(test::error_of([&] { make_cuda_backend(0, bo); }), "exceeds"));
}
