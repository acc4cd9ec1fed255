#pragma once
/// The arithmetic precision of a run's DiT weights (`precision:` / `--precision`) and of its KV pool
/// (`kv.dtype:`): Bf16 is the backend's compute dtype (bf16 on CUDA, f32 on the CPU reference), Fp8 is E4M3
/// with f32 scales (docs/CHECKPOINTS.md "FP8 weights", docs/KV_CACHE.md "FP8 pool").
#include <cstdint>
#include <string>

namespace dzr {

enum class Precision : uint8_t { Bf16, Fp8 };

/// "bf16" or "fp8".
const char* precision_name(Precision p);
/// "bf16" or "fp8"; throws dzr::Error naming `what` ("--precision", "kv.dtype") otherwise.
Precision parse_precision(const std::string& text, const std::string& what);

}  // namespace dzr
