#pragma once
/// The always-on finite check: a few small tensors per DiT evaluation (the velocities, the sampler state, the
/// actions) are scanned for NaN and ±Inf, and a hit fails the call with the stage named. It is cheap (the
/// video velocity is [z, 2, h, w]), unlike --check-finite, which checks every layer and names it.
///
/// NOTE: one helper for every backend: today it counts through Backend::count_nonfinite and reads the count
/// back at once (one download per tensor); a backend may later fuse the count into the kernels that already
/// read these tensors without any caller changing.
#include <string_view>

#include "backend/backend.h"

namespace dzr {

/// Throws dzr::Error "<where>: <what> has N non-finite values (NaN/Inf) in <shape>; ..." when `t` holds a NaN
/// or an infinity. `where` names the call and step ("call 3, denoising step 6"), `what` the tensor.
void check_finite_always(Backend& be, std::string_view where, std::string_view what, const TensorView& t);

/// The same check on host values (the robot actions after post-processing).
void check_finite_host(std::string_view where, std::string_view what, const float* values, size_t n);

}  // namespace dzr
