#pragma once
/// Expected weights: what an inventory lists (every (key, shape, init) a geometry's networks declare; built by
/// model/inventory.h expected_weights(), the networks being its one source), the per-component census and the
/// check of a checkpoint against an inventory.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "weights/weight_init.h"
#include "weights/weight_source.h"

namespace dzr {

enum class Component : uint8_t { Dit, TextEncoder, ImageEncoder, Vae, Backbone, Other };
inline constexpr int kNumComponents = 6;

/// "DiT", "text encoder", "image encoder", "VAE", "backbone", "other".
std::string_view component_name(Component c);
/// Component of a checkpoint key, by prefix (keys.h).
Component component_of(std::string_view key);

struct ExpectedWeight {
    std::string key;
    Shape shape;
    Component component = Component::Other;
    WeightInit init;  // how `dzr ckpt make` fills it (the check ignores it)
    bool linear = false;  // a Linear's [out, in] weight: may be stored F8_E4M3 with `<key>_scale` (fp8_weights.h)
};

/// Tensor count, parameters and bytes of a set of tensors, per component.
struct ComponentCensus {
    std::array<uint64_t, kNumComponents> tensors{};
    std::array<uint64_t, kNumComponents> params{};
    uint64_t total_tensors() const;
    uint64_t total_params() const;
};

ComponentCensus census(const std::vector<ExpectedWeight>& weights);

/// Result of comparing a weight source with the inventory. Keys under `backbone.` are ignored.
struct WeightCheckReport {
    struct Mismatch {
        std::string key;
        std::string location;
        std::string expected;
        std::string found;
    };
    std::vector<ExpectedWeight> missing;
    std::vector<std::string> unexpected;  // keys the inventory does not know
    std::vector<std::string> lora;        // lora_A / lora_B / ... adapter tensors (unmerged)
    std::vector<Mismatch> shape_mismatch;
    std::vector<Mismatch> dtype_mismatch;  // stored dtype not bf16 / f16 / f32 (F8_E4M3 allowed for Linear weights)
    std::vector<Mismatch> fp8_scale;       // an F8_E4M3 weight whose scale is missing, misshapen or not finite > 0
    uint64_t checked = 0;                  // expected weights found with the right shape and dtype

    bool ok() const;
    /// All problems in one message, grouped with counts; each group capped at `cap` lines
    /// ("... and N more"). `what` names the source ("checkpoint /path").
    std::string message(const std::string& what, size_t cap = 20) const;
};

/// Compares `source` against `expected`: missing keys, unexpected keys, shape mismatches and dtype
/// mismatches (bf16, f16 and f32 storage are accepted; F8_E4M3 for Linear weights, whose `<key>_scale` must then
/// be f32 [out] with finite positive values: every scale is read).
WeightCheckReport check_weights(const WeightSource& source, const std::vector<ExpectedWeight>& expected);

/// True for keys of unmerged PEFT LoRA adapters (".lora_A.", ".lora_B.", ".lora_embedding_",
/// ".lora_magnitude").
bool is_lora_key(std::string_view key);

}  // namespace dzr
