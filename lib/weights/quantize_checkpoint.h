#pragma once
/// `dzr ckpt quantize --precision fp8|bf16 IN OUT`: a checkpoint directory rewritten with other weight storage.
///
///  - fp8: every Linear weight the default choice names (fp8_weights.h kFp8LayerTable) and that IN stores as a float
///    becomes F8_E4M3 [out, in] plus `<key>_scale` F32 [out] (per-output-channel, core/fp8.h); Linear weights IN
///    already stores as F8_E4M3 are copied with their scales; every other tensor is copied byte for byte.
///  - bf16: every F8_E4M3 Linear weight becomes bf16 (its values times their scales) and its scale is dropped; the
///    rest is copied.
///
/// OUT is a real checkpoint: shards of at most `shard_size` tensor bytes (a weight and its scale in one shard), the
/// index when there is more than one, config.json, experiment_cfg/ and the tokenizer copied from IN, and a fresh
/// checksums.sha256. It is written into a temporary sibling directory, validated by reopening it, and renamed at the
/// end: a failure leaves nothing.
#include <cstdint>
#include <filesystem>
#include <vector>

#include "config/precision.h"
#include "weights/checkpoint.h"
#include "weights/inventory.h"

namespace dzr {

struct QuantizeOptions {
    Precision precision = Precision::Fp8;
    uint64_t shard_size = 5'000'000'000;  // most tensor bytes per shard (HF's default 5 GB)
    int threads = 0;                      // shards written at once; 0 = up to 8 (the bytes never depend on it)
};

struct QuantizeResult {
    size_t tensors = 0;      // tensors written (scales included)
    size_t converted = 0;    // Linear weights quantized (fp8) or dequantized (bf16)
    size_t copied = 0;       // tensors copied byte for byte
    uint64_t in_bytes = 0;   // IN's tensor bytes
    uint64_t out_bytes = 0;  // OUT's tensor bytes
    size_t shards = 0;
};

/// Writes `in` (which must pass check_weights against `expected`, the inventory of its geometry) into `out` (which
/// must not exist, or be an empty directory, and must not be `in`). Throws dzr::Error naming the file or tensor.
QuantizeResult quantize_checkpoint(const Checkpoint& in, const std::vector<ExpectedWeight>& expected,
                                   const std::filesystem::path& out, const QuantizeOptions& options);

}  // namespace dzr
