#pragma once
/// Where model code gets its weights. A WeightSource resolves a checkpoint key (used verbatim, e.g.
/// "action_head.model.blocks.3.self_attn.q.weight") to a host view of the stored bytes. Models call
/// WeightLoader::require() once per weight at load and keep typed members; nothing is looked up by
/// string inside a forward.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "weights/bulk_load.h"

namespace dzr {

/// Where a stored tensor's bytes lie in a file.
struct StoredRange {
    std::filesystem::path file;
    uint64_t offset = 0;  ///< of the first byte
};

class WeightSource {
public:
    virtual ~WeightSource() = default;
    /// Host view of the stored tensor (any dtype), or nullopt when absent.
    virtual std::optional<TensorView> find(const std::string& key) const = 0;
    /// Every key the source holds.
    virtual std::vector<std::string> keys() const = 0;
    /// Where the key lives, for messages ("model-00003-of-00010.safetensors").
    virtual std::string location(const std::string& key) const = 0;
    /// Where the key's stored bytes lie in a file, for loaders that read the files themselves (bulk_load); nullopt
    /// for a source without files (made-up weights) or an absent key.
    virtual std::optional<StoredRange> stored_range(const std::string& key) const {
        (void)key;
        return std::nullopt;
    }
};

/// Uploads weights to a backend, converting to the backend's compute dtype, and records which keys
/// were used so a load can fail on missing or unused weights.
///
/// Deferred mode (defer()): require() allocates and checks each weight but leaves its bytes for finish(), which
/// reads them all at once with bulk_load (parallel reads; pinned staging overlapped with the uploads on a GPU). A
/// network must therefore not read a weight's values before finish() (none does: values are used by forwards only).
class WeightLoader {
public:
    WeightLoader(const WeightSource& source, Backend& backend) : source_(source), backend_(backend) {}
    ~WeightLoader();
    WeightLoader(const WeightLoader&) = delete;
    WeightLoader& operator=(const WeightLoader&) = delete;

    /// The weight `key` with exactly `shape`, on the backend in its compute dtype (or `dtype`).
    /// Throws dzr::Error naming the key, its file, the expected and the found shape.
    Tensor require(const std::string& key, const Shape& shape);
    Tensor require(const std::string& key, const Shape& shape, DType dtype);

    /// Keys of the source under `prefix` that no require() asked for.
    std::vector<std::string> unused(const std::string& prefix) const;
    const std::set<std::string>& used() const { return used_; }
    Backend& backend() { return backend_; }

    /// Defers the bytes of the weights the source can locate in a file (stored_range) to finish(); others, and every
    /// weight on a measuring backend, still upload in require().
    void defer(const BulkLoadOptions& options);
    /// Reads every weight deferred since the last finish() (bulk_load) and waits until they are on the backend;
    /// the loader stays deferred, so a network that must run during loading (a text pre-pass) is built, finished,
    /// run, and the other networks then load with a later finish(). Throws dzr::Error naming the file and the
    /// tensor. Without deferred weights it returns empty statistics.
    BulkLoadStats finish();

private:
    const WeightSource& source_;
    Backend& backend_;
    std::set<std::string> used_;
    std::optional<BulkLoadOptions> defer_;
    std::vector<BulkLoadItem> pending_;
    std::vector<Tensor> pending_tensors_;  // keep the destinations alive until finish()
};

}  // namespace dzr
