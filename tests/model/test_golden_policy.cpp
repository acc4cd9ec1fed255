// Golden parity with the official DreamZero implementation (docs/PARITY.md): dzr's CPU policy at the
// geometry of tests/data/golden/policy_golden.yaml, on the inputs `dzr parity make-inputs` makes, against
// the reference's fp32 run stored in tests/data/golden/policy_golden.safetensors (written by
// scripts/parity/make_golden.sh; never edited by hand). Seven calls: a first call, three commits, the
// window reset at call 4, two more commits. Compared per call: the normalized state, umT5 embeddings,
// CLIP features, the VAE conditioning and clip latents, the DiT's velocities at step 0, the final
// sample and actions, and the post-processed robot actions.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "config/run_config.h"
#include "io/synth_episode.h"
#include "model/inventory.h"
#include "policy/dreamzero_policy.h"
#include "policy/normalization.h"
#include "policy/preprocess.h"
#include "policy/tokenizer.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/random_checkpoint.h"
#include "weights/safetensors.h"

using namespace dzr;
using Json = nlohmann::json;

namespace {

/// Relative error of the parity harness (scripts/parity/compare.py): max_i |a_i - b_i| / max(|b_i|, rms(b)).
double max_rel_error(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double ss = 0;
    for (float v : b) ss += double(v) * v;
    const double rms = b.empty() ? 0.0 : std::sqrt(ss / double(b.size()));
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = std::abs(double(a[i]) - double(b[i]));
        const double den = std::max(std::abs(double(b[i])), rms);
        worst = std::max(worst, den > 0 ? d / den : (d > 0 ? INFINITY : 0.0));
    }
    return worst;
}

std::string fnv1a64(const std::vector<std::vector<uint8_t>>& chunks) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const auto& c : chunks)
        for (uint8_t b : c) h = (h ^ b) * 0x100000001b3ULL;
    return fmt::format("{:016x}", h);
}

/// Elements [start, stop, step) per dimension of a contiguous host f32 tensor, in C order.
std::vector<float> strided(const Tensor& t, const Json& slices) {
    const int rank = t.view().rank();
    REQUIRE(int(slices.size()) == rank);
    const size_t n = size_t(rank);
    std::vector<int64_t> start(n), stop(n), step(n), idx(n);
    for (int d = 0; d < rank; ++d) {
        start[size_t(d)] = slices[size_t(d)][0];
        stop[size_t(d)] = slices[size_t(d)][1];
        step[size_t(d)] = slices[size_t(d)][2];
        REQUIRE(stop[size_t(d)] <= t.view().dim(d));
        idx[size_t(d)] = start[size_t(d)];
    }
    const Shape strides = t.view().shape.contiguous_strides();
    const float* p = t.view().ptr<float>();
    std::vector<float> out;
    while (true) {
        int64_t off = 0;
        for (int d = 0; d < rank; ++d) off += idx[size_t(d)] * strides[d];
        out.push_back(p[off]);
        int d = rank - 1;
        for (; d >= 0; --d) {
            idx[size_t(d)] += step[size_t(d)];
            if (idx[size_t(d)] < stop[size_t(d)]) break;
            idx[size_t(d)] = start[size_t(d)];
        }
        if (d < 0) break;
    }
    return out;
}

std::vector<float> values(const SafetensorsFile& f, const std::string& name) {
    const Tensor t = f.tensor(name);
    REQUIRE(t.view().dtype == DType::F32);
    return {t.view().ptr<float>(), t.view().ptr<float>() + t.view().numel()};
}

struct Golden {
    std::shared_ptr<SafetensorsFile> file;
    Json meta;
    config::RunConfig cfg;

    Golden() {
        file = SafetensorsFile::open(test::data_dir() / "golden/policy_golden.safetensors");
        meta = Json::parse(file->metadata().at("golden"));
        REQUIRE(meta.at("format") == "dzr-golden/1");
        cfg = config::load_run_config(test::source_dir() / meta.at("config").get<std::string>());
    }
};

/// A checkpoint with one weight scaled, to show the comparison notices a small network change.
class ScaledWeight final : public WeightSource {
  public:
    ScaledWeight(const WeightSource& base, std::string key, float factor) : base_(base), key_(std::move(key)) {
        const TensorView v = *base_.find(key_);
        REQUIRE(v.dtype == DType::F32);
        copy_ = Tensor::host(v.shape, DType::F32);
        for (int64_t i = 0; i < v.numel(); ++i) copy_.ptr<float>()[i] = v.ptr<float>()[i] * factor;
    }
    std::optional<TensorView> find(const std::string& key) const override {
        return key == key_ ? std::optional<TensorView>(copy_.view()) : base_.find(key);
    }
    std::vector<std::string> keys() const override { return base_.keys(); }
    std::string location(const std::string& key) const override { return base_.location(key); }

  private:
    const WeightSource& base_;
    std::string key_;
    Tensor copy_;
};

struct Run {
    std::map<std::string, Tensor> stages;  // "c<k>.<stage>" -> host f32
    std::vector<PolicyCallResult> results;
};

/// Runs the policy on the golden's calls (the first `calls` of them) and keeps the compared stages.
Run run_policy(const Golden& g, const WeightSource& weights, const Checkpoint& ckpt, int calls) {
    static const std::vector<std::string> kKeep = {"state",           "text.pos",          "text.neg",
                                                   "clip",            "ys",                "vae.clip",
                                                   "noise.video",     "noise.action",      "velocity.cond.0",
                                                   "velocity.uncond.0", "velocity.action.0", "x",
                                                   "actions"};
    auto be = make_cpu_backend();
    PolicyOptions o;
    o.sampling = g.cfg.sampling;
    o.kv = g.cfg.kv;
    DreamZeroPolicy policy(ckpt.model_config(), weights, droid_embodiment(ckpt.statistics("oxe_droid")),
                           test::data_dir() / "tokenizer/spiece.model", o, *be);
    Run run;
    policy.set_trace([&](std::string_view stage, int call, const TensorView& t) {
        if (std::find(kKeep.begin(), kKeep.end(), std::string(stage)) == kKeep.end()) return;
        Tensor host = Tensor::host(t.shape, DType::F32);
        be->download(t, host);
        run.stages[fmt::format("c{}.{}", call, stage)] = std::move(host);
    });
    const Json& calls_meta = g.meta.at("calls");
    const std::vector<std::string> cams = g.meta.at("cameras");
    REQUIRE(cams == std::vector<std::string>{"exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"});
    for (int k = 0; k < calls; ++k) {
        const Json& c = calls_meta[size_t(k)];
        const int T = c.at("frames");
        std::vector<std::vector<uint8_t>> frames(3);
        for (int cam = 0; cam < 3; ++cam)
            // The frames of `dzr parity make-inputs`; the fixture's per-call FNV-1a digests catch any drift.
            for (int index : c.at("frame_indices"))
                io::append_parity_frame(cam, index, kFrameHeight, kFrameWidth, frames[size_t(cam)]);
        INFO("call ", k);
        REQUIRE(fnv1a64(frames) == c.at("frames_fnv1a64").get<std::string>());
        const Shape s{T, kFrameHeight, kFrameWidth, 3};
        const std::vector<double> joints = c.at("joint_position");
        REQUIRE(joints.size() == 7);
        const Observation obs = droid_observation(
            TensorView(frames[0].data(), DType::U8, s), TensorView(frames[1].data(), DType::U8, s),
            TensorView(frames[2].data(), DType::U8, s), joints, c.at("gripper_position")[0], g.meta.at("prompt"));
        run.results.push_back(policy.step(obs));
        run.stages[fmt::format("c{}.actions_robot", k)] = Tensor::host_f32(Shape{24, 8}, run.results.back().actions);
    }
    return run;
}

/// Worst relative error of every golden tensor (of the first `calls` calls) against the run.
std::map<std::string, double> compare(const Golden& g, const Run& run, int calls) {
    std::map<std::string, double> errors;
    for (const auto& [name, spec] : g.meta.at("tensors").items()) {
        const std::string source = spec.at("source");
        const int call = std::stoi(source.substr(1, source.find('.') - 1));
        if (call >= calls) continue;
        const auto it = run.stages.find(source);
        INFO("golden tensor ", name, " (dzr stage ", source, ")");
        REQUIRE(it != run.stages.end());
        errors[name] = max_rel_error(strided(it->second, spec.at("slices")), values(*g.file, name));
    }
    return errors;
}

// NOTE: measured on the machine that made the fixture: actions <= 1.3e-6, every other stage <= 1.7e-5
// (docs/PARITY.md). The action bound is 5x tighter than the project's fp32 target (1e-4), so that a
// 0.1%-level change of one weight is caught (second test case).
constexpr double kStageTolerance = 1e-4;
constexpr double kActionTolerance = 2e-5;

double tolerance_of(const std::string& name) {
    const bool action = name.ends_with(".actions") || name.ends_with(".actions_robot");
    return action ? kActionTolerance : kStageTolerance;
}

}  // namespace

TEST_CASE("the cpu policy matches the official implementation's fp32 stages over a 7-call window cycle") {
    Golden g;
    test::TempDir dir;
    MakeOptions mo;
    mo.seed = g.meta.at("seed");
    mo.dtype = DType::F32;
    write_random_checkpoint(g.cfg.model, mo, dir / "ckpt");
    const Checkpoint ckpt(dir / "ckpt");

    // The token ids the reference was fed are the ones the policy makes.
    const Umt5Tokenizer tokenizer(test::data_dir() / "tokenizer/spiece.model");
    const PromptTokens tokens = tokenize_droid_prompts(tokenizer, g.meta.at("prompt").get<std::string>(),
                                                       g.cfg.model.t5.text_len);
    for (const auto& [name, ids] : {std::pair{"text_ids", &tokens.positive.ids},
                                    std::pair{"text_negative_ids", &tokens.negative.ids}}) {
        const Tensor t = g.file->tensor(name);
        REQUIRE(t.view().dtype == DType::I64);
        CHECK(std::vector<int64_t>(t.view().ptr<int64_t>(), t.view().ptr<int64_t>() + t.view().numel()) == *ids);
    }

    const int calls = int(g.meta.at("calls").size());
    REQUIRE(calls == 7);
    const Run run = run_policy(g, ckpt, ckpt, calls);
    for (int k = 0; k < calls; ++k) {
        const Json& c = g.meta.at("calls")[size_t(k)];
        CAPTURE(k);
        CHECK(run.results[size_t(k)].reset == c.at("reset").get<bool>());
        CHECK(run.results[size_t(k)].start_frame == c.at("denoise_start_frame").get<int>());
    }
    const auto errors = compare(g, run, calls);
    CHECK(errors.size() == g.meta.at("tensors").size());
    for (const auto& [name, err] : errors) {
        INFO(name, ": max relative error ", err);
        CHECK(err <= tolerance_of(name));
    }
    // Noise is dzr's seeded generator, so these are exact.
    CHECK(errors.at("noise.video") == 0.0);
    CHECK(errors.at("noise.action") == 0.0);
}

TEST_CASE("the golden comparison notices a 0.5% change of one DiT weight matrix") {
    Golden g;
    test::TempDir dir;
    MakeOptions mo;
    mo.seed = g.meta.at("seed");
    mo.dtype = DType::F32;
    write_random_checkpoint(g.cfg.model, mo, dir / "ckpt");
    const Checkpoint ckpt(dir / "ckpt");
    const ScaledWeight scaled(ckpt, "action_head.model.blocks.1.ffn.2.weight", 1.005f);
    const Run run = run_policy(g, scaled, ckpt, 1);
    const auto errors = compare(g, run, 1);
    INFO("actions: ", errors.at("c0.actions"), ", velocity.cond.0: ", errors.at("c0.velocity.cond.0"));
    CHECK(errors.at("c0.actions") > tolerance_of("c0.actions"));
    CHECK(errors.at("c0.velocity.cond.0") > tolerance_of("c0.velocity.cond.0"));
    // The encoders do not use that weight.
    CHECK(errors.at("c0.clip") <= tolerance_of("c0.clip"));
    CHECK(errors.at("c0.ys") <= tolerance_of("c0.ys"));
}
