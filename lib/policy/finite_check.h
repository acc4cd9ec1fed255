#pragma once
/// The always-on finite check: a few small tensors per DiT evaluation (the sampler state, the velocities) and the
/// denoised latent are counted for NaN and ±Inf on the device, each into its own counter, with no host sync; the
/// counters are read once per call, after the actions' download (the call's one sync point), and the first check
/// that saw a non-finite value fails the call naming the call, the step and the tensor. It is cheap (the video
/// velocity is [z, 2, h, w]), unlike --check-finite, which checks every layer, synchronizing, and names the layer.
#include <cstdint>
#include <string_view>
#include <vector>

#include "backend/backend.h"

namespace dzr {

class FiniteChecks {
public:
    /// Counters for `capacity` checks per call on the backend (allocated here, once).
    FiniteChecks(Backend& be, int capacity);

    /// Starts a call: its checks will be reported as "call <call>, ...".
    void begin_call(int call);
    /// Queues the count of `t`'s non-finite elements. `what` is a string literal naming the tensor; `step` the
    /// denoising step (-1: after denoising). Throws when the call has used every counter.
    void check(const char* what, int step, const TensorView& t);
    /// Reads the call's counters (synchronizes: call it where the call synchronizes anyway) and throws dzr::Error
    /// naming the first check that saw a non-finite value. A measuring backend's counters are not read.
    void verify();

private:
    struct Label {
        const char* what;
        int step;
        int64_t numel;
    };
    Backend& be_;
    Tensor counts_;  // i32 [capacity] on the backend
    std::vector<Label> labels_;
    std::vector<int32_t> host_;
    int call_ = 0;
};

/// The same check on host values (the robot actions after post-processing): throws naming `where` and `what`.
void check_finite_host(std::string_view where, std::string_view what, const float* values, size_t n);

}  // namespace dzr
