#pragma once
/// Random checkpoints written to a temp dir for the weight-loading tests (unit and CUDA): the tiny geometry and a
/// medium one whose tensors (up to 1.5 MB, some 30 MB of bf16 in all) are split by small reads.
#include <cstdint>
#include <filesystem>
#include <memory>

#include "config/run_config.h"
#include "model/inventory.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"

namespace dzr::test {

inline const ModelConfig& tiny_model() {
    static const ModelConfig m = config::load_run_config(source_dir() / "configs" / "tiny.yaml").model;
    return m;
}

/// The tiny geometry with a wider, deeper DiT and a larger vocabulary.
inline ModelConfig medium_model() {
    ModelConfig m = tiny_model();
    m.dit.dim = 512;
    m.dit.num_heads = 4;
    m.dit.ffn_dim = 1536;
    m.dit.num_layers = 3;
    m.t5.vocab = 20000;
    return m;
}

/// A checkpoint written by write_random_checkpoint into its own temp dir, and its plan.
struct MadeCheckpoint {
    TempDir tmp;
    MakePlan plan;
    std::filesystem::path dir() const { return tmp / "ckpt"; }
};

inline std::unique_ptr<MadeCheckpoint> make_checkpoint(const ModelConfig& model, DType dtype, uint64_t shard_size,
                                                       uint64_t seed) {
    auto m = std::make_unique<MadeCheckpoint>();
    MakeOptions o;
    o.seed = seed;
    o.dtype = dtype;
    o.shard_size = shard_size;
    m->plan = write_random_checkpoint(model, o, m->dir());
    return m;
}

}  // namespace dzr::test
