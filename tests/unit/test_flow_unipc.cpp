// FlowUniPC's literal op sequence: the f32 Backend sampler against the literal host port, and the bf16
// path bit for bit against an independent eager-op emulation (test_flow_unipc_emulation.h), run here
// on a host backend that rounds every op's result to bf16 as the CUDA backend does.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/host_context.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/half.h"
#include "sampling/flow_unipc.h"
#include "sampling/step_schedule.h"
#include "support/test_support.h"
#include "unit/test_flow_unipc_emulation.h"

using namespace dzr;

namespace {

// A host backend with the CUDA backend's elementwise semantics on f32 and bf16 tensors: every op reads
// its inputs as float, computes in float (scale as fmaf(alpha, x, beta)) and rounds its result once to
// the output dtype. Only what the sampler needs; every other op throws (Backend's defaults).
class HostRoundingBackend final : public Backend {
  public:
    HostRoundingBackend() : device_(size_t(16) << 20) {}

    std::string name() const override { return "host rounding (test)"; }
    DType compute_dtype() const override { return DType::BF16; }
    DeviceContext& context() override { return device_; }
    const DeviceContext& context() const override { return device_; }
    Stream& stream() override { return stream_; }
    void do_copy(const TensorView& src, const TensorView& dst) override { convert_copy_host(src, dst); }
    void do_fill(const TensorView& dst, float value) override {
        for (int64_t i = 0; i < dst.numel(); ++i) put(dst, i, value);
    }

    void do_binary(const BinaryParams& p, const TensorView& a, const TensorView& b,
                   const TensorView& out) override {
        REQUIRE(a.numel() == b.numel());
        REQUIRE(out.numel() == a.numel());
        for (int64_t i = 0; i < a.numel(); ++i) {
            const float x = get(a, i), y = get(b, i);
            put(out, i, p.op == BinaryOp::Add ? x + y : p.op == BinaryOp::Sub ? x - y : x * y);
        }
        ++ops_;
    }
    void do_scale(const ScaleParams& p, const TensorView& x, const TensorView& out) override {
        REQUIRE(out.numel() == x.numel());
        for (int64_t i = 0; i < x.numel(); ++i) put(out, i, std::fmaf(p.alpha, get(x, i), p.beta));
        ++ops_;
    }

    int ops() const { return ops_; }

  private:
    static float get(const TensorView& t, int64_t i) {
        return t.dtype == DType::BF16 ? bf16_to_f32(static_cast<const uint16_t*>(t.data)[i])
                                      : static_cast<const float*>(t.data)[i];
    }
    static void put(const TensorView& t, int64_t i, float v) {
        if (t.dtype == DType::BF16)
            static_cast<uint16_t*>(t.data)[i] = f32_to_bf16(v);
        else
            static_cast<float*>(t.data)[i] = v;
    }

    HostDevice device_;
    HostStream stream_;
    int ops_ = 0;
};

std::vector<float> round_bf16(std::vector<float> v) {
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
}

std::vector<uint16_t> bits_of(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t k = 0; k < v.size(); ++k) b[k] = f32_to_bf16(v[k]);
    return b;
}

std::vector<float> read_bf16(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    const auto* p = static_cast<const uint16_t*>(t.view().data);
    for (size_t k = 0; k < v.size(); ++k) v[k] = bf16_to_f32(p[k]);
    return v;
}

void write_bf16(const Tensor& t, const std::vector<float>& v) {
    auto* p = static_cast<uint16_t*>(t.view().data);
    for (size_t k = 0; k < v.size(); ++k) p[k] = f32_to_bf16(v[k]);
}

// max |a - b| / max(1, |b|)
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0;
    for (size_t k = 0; k < a.size(); ++k)
        worst =
            std::max(worst, std::fabs(double(a[k]) - double(b[k])) / std::max(1.0, std::fabs(double(b[k]))));
    return worst;
}

}  // namespace

TEST_CASE("division of a bf16 value by a bf16 scalar rounds like the product with its f32 reciprocal") {
    // The sampler computes PyTorch's div.Tensor(bf16, f32[]) as a scale by 1 / bf16(s) (no Div op). Check
    // every normal bf16 dividend in a wide exponent range against every divisor significand in [1, 2)
    // and a few binades.
    int64_t checked = 0, mismatched = 0;
    for (uint32_t divisor_bits = 0x3f80; divisor_bits < 0x4000; ++divisor_bits) {
        for (const float binade : {1.f, -0.25f, 4096.f}) {
            const float s = bf16_to_f32(uint16_t(divisor_bits)) * binade;
            const float inv = 1.f / s;
            for (uint32_t t_bits = 0; t_bits < 0x10000; ++t_bits) {
                const uint32_t exponent = (t_bits >> 7) & 0xff;
                if (exponent < 30 || exponent > 220) continue;  // keep quotients normal
                const float t = bf16_to_f32(uint16_t(t_bits));
                ++checked;
                if (f32_to_bf16(t / s) != f32_to_bf16(std::fmaf(inv, t, 0.f))) ++mismatched;
            }
        }
    }
    CHECK(checked > 10'000'000);
    CHECK(mismatched == 0);
}

TEST_CASE("the eager emulation in f32 equals the literal port of the official step exactly") {
    // Anchors the emulation (used for the bf16 checks) on FlowUniPCReference, which the goldens tie to
    // the official scheduler.
    const size_t n = 40;
    FlowUniPCReference literal;
    test::EmulatedUniPC emulated(make_flow_schedule({}).sigmas, false);
    std::vector<float> x_lit = test::random_floats(n, 3, -2.f, 2.f), x_emu = x_lit;
    for (int i = 0; i < 16; ++i) {
        const std::vector<float> v = test::random_floats(n, 500 + uint64_t(i), -1.5f, 1.5f);
        literal.step(v, x_lit);
        emulated.step(v, x_emu);
        CAPTURE(i);
        for (size_t k = 0; k < n; ++k) CHECK(x_emu[k] == x_lit[k]);
    }
}

TEST_CASE("f32 backend sampler equals the literal port within 1e-6 over all 16 steps") {
    auto be = make_cpu_backend(size_t(64) << 20);
    const Shape shape{3, 7, 5};
    const size_t n = size_t(shape.numel());
    for (const bool masked : {false, true}) {
        CAPTURE(masked);
        // the 8-of-16 evaluation mask: skipped steps reuse the last velocity
        const std::vector<bool> mask =
            masked ? StepSchedule::from_num_dit_steps(8).mask() : std::vector<bool>(16, true);
        FlowUniPC sampler(*be, shape, DType::F32);
        FlowUniPCReference literal;
        std::vector<float> x_lit = test::random_floats(n, 17, -2.f, 2.f);
        Tensor x = Tensor::host_f32(shape, x_lit);
        std::vector<float> v;
        for (int i = 0; i < 16; ++i) {
            if (mask[size_t(i)]) {
                v = test::random_floats(n, 900 + uint64_t(i), -1.5f, 1.5f);
                for (size_t k = 0; k < n; ++k)
                    v[k] += 0.3f * x_lit[k];  // depends on the sample, like a network
            }
            sampler.step(Tensor::host_f32(shape, v), x);
            literal.step(v, x_lit);
            CAPTURE(i);
            CHECK(max_rel(std::vector<float>(x.ptr<float>(), x.ptr<float>() + n), x_lit) <= 1e-6);
        }
    }
}

TEST_CASE("bf16 sampler rounds bit for bit like the reference's eager ops over 16 steps") {
    HostRoundingBackend be;
    for (const int num_steps : {16, 2, 1}) {
        for (const bool masked : {false, true}) {
            if (masked && num_steps != 16) continue;
            CAPTURE(num_steps);
            CAPTURE(masked);
            const FlowUniPCConfig cfg{num_steps, 5.0, 1000};
            const Shape shape{2, 16, 9};
            const size_t n = size_t(shape.numel());
            const std::vector<bool> mask = masked ? StepSchedule::from_num_dit_steps(8).mask()
                                                  : std::vector<bool>(size_t(num_steps), true);
            FlowUniPC sampler(be, shape, DType::BF16, cfg);
            test::EmulatedUniPC emulated(make_flow_schedule(cfg).sigmas, true);

            std::vector<float> x_emu = round_bf16(test::random_floats(n, 31, -3.f, 3.f));
            Tensor x = be.alloc(shape, DType::BF16), v = be.alloc(shape, DType::BF16);
            write_bf16(x, x_emu);
            std::vector<float> vel;
            for (int i = 0; i < num_steps; ++i) {
                if (mask[size_t(i)]) {
                    vel = test::random_floats(n, 700 + uint64_t(i), -2.f, 2.f);
                    for (size_t k = 0; k < n; ++k) vel[k] -= 0.5f * x_emu[k];
                    vel = round_bf16(vel);
                }
                write_bf16(v, vel);
                sampler.step(v, x);
                emulated.step(vel, x_emu);
                CAPTURE(i);
                CHECK(bits_of(read_bf16(x)) == bits_of(x_emu));
            }
        }
    }
}

TEST_CASE("bf16 sampler takes a velocity of another dtype and runs a fixed op count per step") {
    HostRoundingBackend be;
    const Shape shape{64};
    FlowUniPC sampler(be, shape, DType::BF16);
    test::EmulatedUniPC emulated(make_flow_schedule({}).sigmas, true);
    std::vector<float> x_emu = round_bf16(test::random_floats(64, 5));
    Tensor x = be.alloc(shape, DType::BF16);
    write_bf16(x, x_emu);
    // Ops per step: x0 prediction 2; corrector 0 (step 0), 8 (order 1), 11 (order 2); predictor 4
    // (order 1) or 8 (order 2); plus the f32 -> bf16 velocity conversion (a copy, not counted).
    const int expected[16] = {2 + 4,      2 + 8 + 8,  2 + 11 + 8, 2 + 11 + 8, 2 + 11 + 8, 2 + 11 + 8,
                              2 + 11 + 8, 2 + 11 + 8, 2 + 11 + 8, 2 + 11 + 8, 2 + 11 + 8, 2 + 11 + 8,
                              2 + 11 + 8, 2 + 11 + 8, 2 + 11 + 8, 2 + 11 + 4};
    for (int i = 0; i < 16; ++i) {
        const std::vector<float> v32 = test::random_floats(64, 60 + uint64_t(i));
        const int before = be.ops();
        const size_t arena_before = be.workspace().used();
        sampler.step(Tensor::host_f32(shape, v32), x);  // converted to bf16 first, like `.to(bf16)`
        CHECK(be.ops() - before == expected[i]);
        CHECK(be.workspace().used() == arena_before);  // scratch released
        emulated.step(round_bf16(v32), x_emu);
    }
    CHECK(bits_of(read_bf16(x)) == bits_of(x_emu));
}
