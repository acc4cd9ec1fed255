// FlowUniPC on the CUDA backend in bf16 against the eager-op emulation of the official scheduler
// (tests/unit/test_flow_unipc_emulation.h): bit for bit over 16 steps on DreamZero's video and action
// shapes, with every step's sample compared. The f32 CUDA path is checked against the literal port.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "sampling/flow_unipc.h"
#include "sampling/step_schedule.h"
#include "support/test_support.h"
#include "unit/test_flow_unipc_emulation.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

namespace {

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t k = 0; k < v.size(); ++k) b[k] = f32_to_bf16(v[k]);
    return b;
}

std::vector<float> from_bf16_bits(const std::vector<uint16_t>& b) {
    std::vector<float> v(b.size());
    for (size_t k = 0; k < b.size(); ++k) v[k] = bf16_to_f32(b[k]);
    return v;
}

void upload_bits(Backend& be, const std::vector<uint16_t>& bits, const TensorView& dst) {
    be.upload(TensorView(const_cast<uint16_t*>(bits.data()), DType::BF16, dst.shape), dst);
}

std::vector<uint16_t> download_bits(Backend& be, const TensorView& src) {
    std::vector<uint16_t> bits(size_t(src.numel()));
    be.download(src, TensorView(bits.data(), DType::BF16, src.shape));
    return bits;
}

}  // namespace

TEST_CASE("cuda bf16 sampler matches the eager bf16 emulation bit for bit over 16 steps") {
    auto be = make_cuda_backend(0, size_t(64) << 20);
    // DreamZero's scheduler shapes: video [1, 2, 16, 44, 80], action [1, 24, 32]
    for (const Shape& shape : {Shape{1, 2, 16, 44, 80}, Shape{1, 24, 32}}) {
        for (const bool masked : {false, true}) {
            CAPTURE(shape.str());
            CAPTURE(masked);
            const size_t n = size_t(shape.numel());
            const std::vector<bool> mask =
                masked ? StepSchedule::from_num_dit_steps(8).mask() : std::vector<bool>(16, true);
            FlowUniPC sampler(*be, shape, DType::BF16);
            test::EmulatedUniPC emulated(make_flow_schedule({}).sigmas, true);
            std::vector<uint16_t> x_bits = to_bf16_bits(test::random_floats(n, 41, -3.f, 3.f));
            std::vector<float> x_emu = from_bf16_bits(x_bits);
            Tensor x = be->alloc(shape, DType::BF16), v = be->alloc(shape, DType::BF16);
            upload_bits(*be, x_bits, x);
            std::vector<uint16_t> v_bits;
            for (int i = 0; i < 16; ++i) {
                if (mask[size_t(i)]) {
                    std::vector<float> vel = test::random_floats(n, 800 + uint64_t(i), -2.f, 2.f);
                    for (size_t k = 0; k < n; ++k) vel[k] -= 0.5f * x_emu[k];
                    v_bits = to_bf16_bits(vel);
                    upload_bits(*be, v_bits, v);
                }
                sampler.step(v, x);
                emulated.step(from_bf16_bits(v_bits), x_emu);
                const std::vector<uint16_t> got = download_bits(*be, x);
                const std::vector<uint16_t> want = to_bf16_bits(x_emu);
                size_t mismatches = 0, first = n;
                for (size_t k = 0; k < n; ++k) {
                    if (got[k] != want[k]) {
                        ++mismatches;
                        if (first == n) first = k;
                    }
                }
                CAPTURE(i);
                if (mismatches > 0)
                    MESSAGE("step " << i << ": " << mismatches << " of " << n << " differ, first at " << first
                                    << ": cuda " << bf16_to_f32(got[first]) << " vs emulation "
                                    << bf16_to_f32(want[first]));
                CHECK(mismatches == 0);
            }
        }
    }
}

TEST_CASE("cuda f32 sampler equals the literal port within 1e-6 over 16 steps") {
    auto be = make_cuda_backend(0, size_t(64) << 20);
    const Shape shape{1, 24, 32};
    const size_t n = size_t(shape.numel());
    FlowUniPC sampler(*be, shape, DType::F32);
    FlowUniPCReference literal;
    std::vector<float> x_lit = test::random_floats(n, 43, -2.f, 2.f);
    Tensor x = be->alloc(shape, DType::F32), v = be->alloc(shape, DType::F32);
    be->upload(TensorView(x_lit.data(), DType::F32, shape), x);
    std::vector<float> got(n);
    for (int i = 0; i < 16; ++i) {
        std::vector<float> vel = test::random_floats(n, 850 + uint64_t(i), -1.5f, 1.5f);
        be->upload(TensorView(vel.data(), DType::F32, shape), v);
        sampler.step(v, x);
        literal.step(vel, x_lit);
        be->download(x, TensorView(got.data(), DType::F32, shape));
        double worst = 0;
        for (size_t k = 0; k < n; ++k)
            worst = std::max(
                worst, std::fabs(double(got[k]) - x_lit[k]) / std::max(1.0, std::fabs(double(x_lit[k]))));
        CAPTURE(i);
        CHECK(worst <= 1e-6);
    }
}
