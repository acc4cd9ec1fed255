#pragma once
/// `dzr bench vae`: times the Wan VAE encoder at a config's canvas with random weights (no checkpoint): the
/// 9-frame clip of a rollout call ([f0, f0, f0, f1, f1, f2, f2, f3, f3] -> 3 latent frames, VaePrecision::Eager) and
/// the num_frames-frame `ys` conditioning of a window reset (VaePrecision::Autocast), each the median of N runs
/// timed with the stream's events after a warm-up (which plans, and in fast numerics tunes, every convolution).
/// In fast numerics it also encodes the same inputs on a reference-numerics backend and prints the difference, and
/// prints the backend's convolution plans (Backend::conv_plan_report). With `profile`, a per-op breakdown of both encodes.
#include <cstdint>
#include <string>

namespace dzr::app {

struct VaeBenchOptions {
    std::string config = "configs/dreamzero_droid.yaml";
    std::string device = "cuda:0";
    std::string numerics = "fast";
    int warmup = 2;
    int repeats = 10;
    uint64_t seed = 0;
    bool compare = true;  ///< fast numerics: also run reference numerics and print the difference
    /// Also time every op of `repeats` more encodes of each kind on a profiled backend (BackendOptions::profile, its
    /// own warm-up and tuning) and print the profiler's table (regions clip_encode and ys_encode).
    bool profile = false;
};

int run_vae_bench(const VaeBenchOptions& options);

}  // namespace dzr::app
