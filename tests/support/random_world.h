#pragma once
/// What the policy and engine tests share: a random f32 checkpoint of the tiny config (with geometry
/// overrides) in its own temp dir, the policy options of its run settings, and DROID calls whose camera
/// frames follow a pattern.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/run_config.h"
#include "core/tensor.h"
#include "policy/engine.h"
#include "policy/normalization.h"
#include "policy/observation.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/random_checkpoint.h"

namespace dzr::test {

struct RandomWorld {
    TempDir dir;
    config::RunConfig cfg;
    std::unique_ptr<Checkpoint> ckpt;

    RandomWorld(const std::vector<config::Override>& geometry, uint64_t seed) {
        cfg = config::load_run_config(source_dir() / "configs/tiny.yaml", geometry);
        MakeOptions mo;
        mo.seed = seed;
        mo.dtype = DType::F32;
        mo.tokenizer = tokenizer();
        write_random_checkpoint(cfg.model, mo, dir / "ckpt");
        ckpt = std::make_unique<Checkpoint>(dir / "ckpt");
    }

    static std::filesystem::path tokenizer() { return data_dir() / "tokenizer/spiece.model"; }
    Embodiment droid() const { return droid_embodiment(ckpt->statistics("oxe_droid")); }
    /// The run config's sampling and kv settings, everything else PolicyOptions' defaults.
    PolicyOptions options() const {
        PolicyOptions o;
        o.sampling = cfg.sampling;
        o.kv = cfg.kv;
        return o;
    }
    std::unique_ptr<Engine> engine(const PolicyOptions& o) const {
        return Engine::create(ckpt->model_config(), *ckpt, droid(), tokenizer(), o, {Device::cpu()},
                              BackendOptions{});
    }
};

/// One DROID call: three cameras' frames [T, 180, 320, 3] with pixel(i, camera) at flat index i, joints(j)
/// for the seven joints, a gripper value and a prompt.
struct DroidCall {
    std::vector<uint8_t> data[3];
    Observation obs;

    DroidCall(int T, const std::function<uint8_t(size_t, int)>& pixel,
              const std::function<double(int)>& joints, double gripper, const std::string& prompt) {
        const Shape s{T, 180, 320, 3};
        TensorView views[3];
        for (int c = 0; c < 3; ++c) {
            data[c].resize(size_t(s.numel()));
            for (size_t i = 0; i < data[c].size(); ++i) data[c][i] = pixel(i, c);
            views[c] = TensorView(data[c].data(), DType::U8, s);
        }
        double q[7];
        for (int j = 0; j < 7; ++j) q[j] = joints(j);
        obs = droid_observation(views[0], views[1], views[2], q, gripper, prompt);
    }
    // obs points into data: a copy would point into the original's frames
    DroidCall(const DroidCall&) = delete;
    DroidCall& operator=(const DroidCall&) = delete;
};

}  // namespace dzr::test
