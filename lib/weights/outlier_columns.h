#pragma once
/// Outlier input columns for the FP8 gates (docs/PARITY.md, "The FP8 gates at the real widths"): random
/// weights have no outliers, so `dzr ckpt make --outlier-columns N --outlier-scale S` multiplies N input
/// columns of every Linear weight [out, in] that `--precision fp8` quantizes (fp8_weights.h kFp8LayerTable:
/// the DiT layers' twelve Linears) by S. Per-output-channel scales must then cope with one large element in
/// every row of such a weight.
///
/// Determinism: the columns of weight `key` come from their own generator, WeightRng(seed, key +
/// "#outlier_columns") (random_checkpoint.h), N distinct ones in [0, in), ascending; same seed, key and width
/// => the same columns. Each chosen element becomes its stored value times S, rounded to the stored dtype
/// (exact products in f32). Every other element, and every other tensor, keeps the bytes `dzr ckpt make`
/// writes without the option.
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "weights/inventory.h"

namespace dzr {

struct OutlierOptions {
    int columns = 0;      ///< input columns per weight; 0: none (the default checkpoint)
    float scale = 30.0f;  ///< factor of those columns

    bool enabled() const { return columns > 0; }
};

/// True for the weights that get outlier columns: the Linear weights `--precision fp8` quantizes by default.
bool takes_outlier_columns(const ExpectedWeight& weight);

/// The `count` distinct input columns of weight `key` (with `in_features` columns) chosen for `seed`,
/// ascending. Throws dzr::Error naming the key when count is not in [0, in_features).
std::vector<int64_t> outlier_columns(uint64_t seed, std::string_view key, int64_t in_features, int count);

/// Multiplies the chosen columns of `weight`'s stored bytes (`dtype`: f32, bf16 or f16; row-major [out, in])
/// by `options.scale` in place. Nothing when the options are off or the weight takes none
/// (takes_outlier_columns).
void apply_outlier_columns(const ExpectedWeight& weight, uint64_t seed, const OutlierOptions& options,
                           DType dtype, std::vector<uint8_t>& bytes);

/// Checks the options against an inventory before anything is written: a finite non-zero scale, and fewer
/// columns than the narrowest weight that takes them has. Returns how many weights take outlier columns.
size_t check_outlier_options(const std::vector<ExpectedWeight>& weights, const OutlierOptions& options);

}  // namespace dzr
