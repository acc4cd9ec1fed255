#pragma once
/// Host-side element conversion between dtypes (f32, bf16, f16, f8_e4m3, i32, i64, u8).
#include "core/tensor.h"

namespace dzr {

/// Copy src into dst converting the dtype. Both must be host views with the same number of
/// elements; src may be strided (any permutation), dst must be contiguous. Floats convert with
/// round-to-nearest-even; integer targets truncate toward zero.
void convert_copy_host(const TensorView& src, const TensorView& dst);

}  // namespace dzr
