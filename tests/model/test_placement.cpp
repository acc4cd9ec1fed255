// The CFG branches on two backends (CPU): `--device cpu,cpu` gives the actions of `--device cpu` bit for bit, a
// failure on the second backend closes the session on both, and `dzr rollout --device cpu,cpu` writes the same
// actions as a one-device rollout.
// NOTE: on the micro geometry (support/micro_geometry.h; what is compared does not depend on the canvas): 15 s
// against 113 s for the tiny one on the 2-core CI machine; DZR_LONG_TESTS=1 runs the tiny geometry.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <set>

#include "backend/backend.h"
#include "backend/profiler.h"
#include "config/run_config.h"
#include "core/error.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "model/inventory.h"
#include "policy/dreamzero_policy.h"
#include "policy/normalization.h"
#include "rollout/runner.h"
#include "support/micro_geometry.h"
#include "support/random_world.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

/// A CPU backend that throws from its `fail_at`-th GEMM on (counting from 1; 0 = never).
class FailingBackend final : public Backend {
public:
    FailingBackend() : inner_(make_cpu_backend()) {}
    int fail_at = 0;

    std::string name() const override { return "cpu (failing on demand)"; }
    DType compute_dtype() const override { return inner_->compute_dtype(); }
    DeviceContext& context() override { return inner_->context(); }
    const DeviceContext& context() const override { return static_cast<const Backend&>(*inner_).context(); }
    Stream& stream() override { return inner_->stream(); }
    void do_copy(const TensorView& s, const TensorView& d) override { inner_->copy(s, d); }
    void do_fill(const TensorView& d, float v) override { inner_->fill(d, v); }
    void do_gemm(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                 const TensorView& out) override {
        if (fail_at > 0 && ++gemms_ >= fail_at) throw Error("injected failure on the second backend");
        inner_->gemm(p, a, b, bias, out);
    }
    void do_binary(const BinaryParams& p, const TensorView& a, const TensorView& b,
                   const TensorView& o) override {
        inner_->binary(p, a, b, o);
    }
    void do_scale(const ScaleParams& p, const TensorView& x, const TensorView& o) override {
        inner_->scale(p, x, o);
    }
    void do_activation(const ActivationParams& p, const TensorView& x, const TensorView& o) override {
        inner_->activation(p, x, o);
    }
    void do_layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& w,
                       const TensorView& b, const TensorView& o) override {
        inner_->layer_norm(p, x, w, b, o);
    }
    void do_rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& w,
                     const TensorView& o) override {
        inner_->rms_norm(p, x, w, o);
    }
    void do_l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& w,
                    const TensorView& o) override {
        inner_->l2_norm(p, x, w, o);
    }
    void do_softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& o) override {
        inner_->softmax(p, x, o);
    }
    void do_reduce(const ReduceParams& p, const TensorView& x, const TensorView& o) override {
        inner_->reduce(p, x, o);
    }
    void do_rope(const RopeParams& p, const TensorView& x, const TensorView& t,
                 const TensorView& o) override {
        inner_->rope(p, x, t, o);
    }
    void do_attention(const AttentionParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& bias, const TensorView& o) override {
        inner_->attention(p, q, k, v, bias, o);
    }
    void do_conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& b,
                   const TensorView& o) override {
        inner_->conv3d(p, x, w, b, o);
    }
    void do_paged_attention(const AttentionParams& p, const TensorView& q, const PagedKvView& h, int layer,
                            const TensorView& k, const TensorView& v, const TensorView& o) override {
        inner_->paged_attention(p, q, h, layer, k, v, o);
    }
    void do_scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                       const TensorView& v, int64_t n) override {
        inner_->scatter_kv(pool, layer, slots, k, v, n);
    }

private:
    std::unique_ptr<Backend> inner_;
    int gemms_ = 0;
};

struct TinyWorld : test::RandomWorld {
    TinyWorld() : RandomWorld(test::ci_geometry(), 11) {}
    std::unique_ptr<DreamZeroPolicy> policy(const Placement& placement, KvMode mode) const {
        PolicyOptions o = options();
        o.kv.mode = mode;
        return std::make_unique<DreamZeroPolicy>(ckpt->model_config(), *ckpt, droid(), tokenizer(), o, placement);
    }
};

/// Frames [T, 180, 320, 3] that differ per call, frame and camera.
test::DroidCall call_input(int T, int call) {
    return test::DroidCall(
        T, [&](size_t i, int c) { return uint8_t((i * 31 + size_t(call) * 17 + size_t(c) * 5) % 251); },
        [&](int j) { return 0.05 * j - 0.1 + 0.02 * call; }, 0.4, "Put the marker in the cup");
}

/// Actions of `calls` calls (the window cycle with a reset at call 4 when calls > 4).
std::vector<std::vector<float>> run_calls(DreamZeroPolicy& policy, int calls) {
    std::vector<std::vector<float>> out;
    for (int call = 0; call < calls; ++call) {
        const test::DroidCall in = call_input(call == 0 ? 1 : 4, call);
        out.push_back(policy.step(in.obs).actions);
    }
    return out;
}

}  // namespace

TEST_CASE("two CPU backends, one CFG branch each, give the actions of one backend bit for bit") {
    TinyWorld world;
    for (KvMode mode : {KvMode::Paged, KvMode::Dense}) {
        CAPTURE(mode == KvMode::Paged ? "paged" : "dense");
        auto one = make_cpu_backend();
        auto cond = make_cpu_backend(), uncond = make_cpu_backend();
        auto single = world.policy(Placement{{one.get()}}, mode);
        auto split = world.policy(Placement{{cond.get(), uncond.get()}}, mode);
        CHECK(split->engine().placement().device_of(kUncondBranch) == 1);
        const auto expected = run_calls(*single, 7);
        const auto got = run_calls(*split, 7);
        REQUIRE(got.size() == expected.size());
        for (size_t c = 0; c < got.size(); ++c) {
            CAPTURE(c);
            CHECK(got[c] == expected[c]);
        }
        if (mode == KvMode::Paged) {
            REQUIRE(split->engine().kv_manager(1) != nullptr);
            CHECK(split->engine().kv_manager(0)->geometry().num_branches == 1);
            CHECK(split->engine().kv_manager(1)->geometry().num_branches == 1);
        }
    }
}

TEST_CASE("fast numerics: the CFG branches batched on one backend give the actions of the branches one at a time") {
    TinyWorld world;
    for (KvMode mode : {KvMode::Paged, KvMode::Dense}) {
        CAPTURE(mode == KvMode::Paged ? "paged" : "dense");
        // 0: one branch at a time; 1: batched; 2: batched with a trace of the branches' own outputs (a parity run's)
        std::vector<std::vector<float>> actions[3];
        std::string regions[3];
        std::set<std::string> traced;
        for (int variant = 0; variant < 3; ++variant) {
            BackendOptions bo;
            bo.numerics = Numerics::Fast;
            bo.profile = true;  // the profile's regions say which forwards ran
            auto be = make_backend(Device::cpu(), bo);
            PolicyOptions o;
            o.sampling = world.cfg.sampling;
            o.kv = world.cfg.kv;
            o.kv.mode = mode;
            o.batch_cfg = variant > 0;
            o.trace_dit_layers = false;
            DreamZeroPolicy policy(world.ckpt->model_config(), *world.ckpt,
                                   droid_embodiment(world.ckpt->statistics("oxe_droid")),
                                   test::data_dir() / "tokenizer/spiece.model", o, Placement{{be.get()}});
            if (variant == 2)
                policy.set_trace([&traced](std::string_view stage, int, const TensorView&) { traced.emplace(stage); });
            // the window cycle: prefill, commits, a reset at call 4
            actions[variant] = run_calls(policy, 7);
            REQUIRE(be->profiler() != nullptr);
            regions[variant] = be->profiler()->table();
        }
        // the traced batched run: each branch's own outputs under its name, no layer intermediates, the same actions
        CHECK(regions[2].find("denoise.both") != std::string::npos);
        for (const char* name : {"dit.denoise.pos.patch_embed", "dit.denoise.neg.patch_embed", "dit.denoise.pos.head",
                                 "dit.denoise.neg.head", "dit.denoise.pos.action_velocity",
                                 "dit.denoise.neg.action_velocity", "dit.commit.neg.head"}) {
            CAPTURE(name);
            CHECK(traced.count(name) == 1);
        }
        CHECK(traced.count("dit.denoise.pos.layer_out.0") == 0);
        CHECK(actions[2] == actions[1]);
        // batched: one forward of both branches per step; one at a time: a forward per branch
        CHECK(regions[1].find("denoise.both") != std::string::npos);
        CHECK(regions[1].find("commit.both") != std::string::npos);
        CHECK(regions[0].find("denoise.both") == std::string::npos);
        CHECK(regions[0].find("denoise.neg") != std::string::npos);
        // NOTE: the same arithmetic up to f32 summation order (the CPU's GEMM blocks rows by their count)
        for (size_t c = 0; c < actions[0].size(); ++c) {
            CAPTURE(c);
            REQUIRE(actions[1][c].size() == actions[0][c].size());
            double scale = 1.0, worst = 0.0;
            for (float v : actions[0][c]) scale = std::max(scale, std::fabs(double(v)));
            for (size_t i = 0; i < actions[0][c].size(); ++i)
                worst = std::max(worst, std::fabs(double(actions[1][c][i]) - double(actions[0][c][i])));
            CHECK(worst <= 1e-4 * scale);
        }
    }
}

TEST_CASE("a failure on the unconditional branch's backend closes the session on both devices") {
    TinyWorld world;
    auto cond = make_cpu_backend();
    FailingBackend uncond;
    auto policy = world.policy(Placement{{cond.get(), &uncond}}, KvMode::Paged);
    (void)run_calls(*policy, 2);  // a prefill and a commit hold blocks on both devices
    uncond.fail_at = 3;           // the next call's forward on the second backend fails
    const test::DroidCall in = call_input(4, 2);
    CHECK_THROWS_WITH_AS(policy->step(in.obs), doctest::Contains("injected failure"), Error);
    CHECK(policy->engine().kv_pools_whole());
    // The next call starts a new session and computes what a fresh policy computes.
    uncond.fail_at = 0;
    auto fresh_backend = make_cpu_backend();
    auto fresh = world.policy(Placement{{fresh_backend.get()}}, KvMode::Paged);
    const test::DroidCall first = call_input(1, 0);
    const PolicyCallResult r = policy->step(first.obs);
    CHECK(r.reset_reason == "first call");
    const test::DroidCall again = call_input(1, 0);
    CHECK(r.actions == fresh->step(again.obs).actions);
}

TEST_CASE("a rollout with --device cpu,cpu writes the actions of a rollout with --device cpu") {
    test::TempDir dir;
    const auto cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml", test::ci_geometry());
    MakeOptions mo;
    mo.dtype = DType::F32;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(cfg.model, mo, dir / "ckpt");
    io::write_synth_episode(dir / "episodes/ep", io::SynthOptions{});
    std::vector<std::vector<float>> actions;
    for (const char* devices : {"cpu", "cpu,cpu"}) {
        rollout::RolloutOptions o;
        o.checkpoint = dir / "ckpt";
        o.episodes = {dir / "episodes/ep"};
        o.out_dir = dir / (std::string("out-") + devices);
        o.run = cfg;
        o.run.numerics = Numerics::Reference;
        o.run.rollout.max_chunks = 4;  // 5 calls: a prefill and four commits
        o.have_config_model = true;
        o.devices = parse_device_list(devices);
        // the warm-up on both devices (then the KV pools are checked whole); none before the reference, so the
        // comparison also says the warm-up leaves nothing behind
        o.warmup = std::string(devices) == "cpu,cpu";
        o.quiet = true;
        o.report = false;
        const rollout::RolloutResult r = rollout::run_rollout(o);
        REQUIRE(r.failed == 0);
        actions.push_back(io::read_npy(o.out_dir / "ep/actions.npy").to_f32());
    }
    REQUIRE(actions[0].size() == 5u * 24 * 8);
    CHECK(actions[1] == actions[0]);
}
