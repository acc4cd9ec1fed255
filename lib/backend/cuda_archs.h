#pragma once
/// Which GPUs a CUDA build runs on: CMake's CMAKE_CUDA_ARCHITECTURES against a device's compute capability.
#include <string_view>

namespace dzr {

/// Whether code built for `archs` (CMAKE_CUDA_ARCHITECTURES, entries split by ';' or ',': "90a;80;89", "80-real",
/// "86-virtual") runs on a GPU of compute capability `cc` (major * 10 + minor). A plain entry carries SASS and PTX, a
/// "-real" one SASS only, a "-virtual" one PTX only. SASS for sm_XY runs on the same major at minor Y or later; PTX
/// for compute_XY is compiled by the driver for any capability from XY on; an arch-specific entry ("90a") runs on
/// exactly its capability, a family-specific one ("100f") on its major from its minor on. "all", "all-major" and "native" (resolved by CMake at configure time) count as covering.
bool cuda_archs_cover(std::string_view archs, int cc);

}  // namespace dzr
