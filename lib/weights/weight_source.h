#pragma once
/// Where model code gets its weights. A WeightSource resolves a checkpoint key (used verbatim, e.g.
/// "action_head.model.blocks.3.self_attn.q.weight") to a host view of the stored bytes. Models call
/// WeightLoader::require() once per weight at load and keep typed members; nothing is looked up by
/// string inside a forward.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/precision.h"
#include "core/tensor.h"
#include "weights/weight_init.h"
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

/// One weight a network declared: its key, its shape and how `dzr ckpt make` initialises it.
struct WeightDeclaration {
    std::string key;
    Shape shape;
    WeightInit init;     // resolved (never FanIn)
    bool loaded = true;  // false: declare()d only (stored in the checkpoint, never run)
    bool linear = false;  // a Linear's [out, in] weight (require_linear): may be stored F8_E4M3 with a scale
};

/// A Linear's weight as it runs: `w` [out, in] in the compute dtype (scale undefined), or `w` F8_E4M3 [out, in]
/// with `scale` F32 [out] (per output channel, fp8_weights.h).
struct LinearWeight {
    Tensor w;
    Tensor scale;
};

/// Uploads weights to a backend, converting to the backend's compute dtype, and records which keys
/// were used so a load can fail on missing or unused weights.
///
/// Recording mode (no source): require() uploads nothing and returns a tensor of the backend's (on a
/// MeasuringBackend: no memory). Building a network over a recording loader lists its weights, in the order it
/// declares them, with their shapes and init hints: the networks' constructors are the one schema of the
/// checkpoint (model/inventory.h).
///
/// Deferred mode (defer()): require() allocates and checks each weight but leaves its bytes for finish(), which
/// reads them all at once with bulk_load (parallel reads; pinned staging overlapped with the uploads on a GPU). A
/// network must therefore not read a weight's values before finish() (none does: values are used by forwards only).
/// FP8 weights quantized or dequantized at load are converted on the host and uploaded at once.
class WeightLoader {
public:
    WeightLoader(const WeightSource& source, Backend& backend) : source_(&source), backend_(backend) {}
    /// A recording loader.
    explicit WeightLoader(Backend& backend) : backend_(backend) {}
    ~WeightLoader();
    WeightLoader(const WeightLoader&) = delete;
    WeightLoader& operator=(const WeightLoader&) = delete;

    /// The weight `key` with exactly `shape`, on the backend in its compute dtype (or `dtype`).
    /// Throws dzr::Error naming the key, its file, the expected and the found shape. `init`: how a made-up
    /// checkpoint fills it (recorded only).
    Tensor require(const std::string& key, const Shape& shape, WeightInit init = {});
    Tensor require(const std::string& key, const Shape& shape, DType dtype, WeightInit init = {});
    /// A Linear's weight `key` ([out, in] = `shape`), in one of four ways:
    ///  - FP8 (precision fp8 and the key stored as F8_E4M3, or stored as a float and fp8_by_default): E4M3 values
    ///    and the per-output-channel scale, read from the checkpoint (`<key>_scale`, checked) or quantized on the host
    ///    at load (core/fp8.h);
    ///  - else the compute dtype: a stored F8_E4M3 weight is dequantized on the host (values * scale) at load.
    /// On a measuring backend nothing is read: the tensors are allocated with the dtypes the real load would give.
    /// Recorded as a Linear weight (WeightDeclaration::linear). Throws naming the key and its file.
    LinearWeight require_linear(const std::string& key, const Shape& shape, WeightInit init = {});
    /// The precision require_linear loads for (default: the compute dtype).
    void set_precision(Precision p) { precision_ = p; }
    Precision precision() const { return precision_; }
    /// A weight the checkpoint holds but the network never runs (CLIP's head): recorded, not loaded (and so
    /// reported by unused()).
    void declare(const std::string& key, const Shape& shape, WeightInit init = {});
    /// While one lives, require() only declares and returns an undefined tensor: a network runs its loading
    /// code over the modules it keeps in the checkpoint but never runs (CLIP's last block) and drops them.
    class DeclareOnly {
    public:
        explicit DeclareOnly(WeightLoader& loader) : loader_(loader), was_(loader.declare_only_) {
            loader.declare_only_ = true;
        }
        ~DeclareOnly() { loader_.declare_only_ = was_; }
        DeclareOnly(const DeclareOnly&) = delete;
        DeclareOnly& operator=(const DeclareOnly&) = delete;

    private:
        WeightLoader& loader_;
        bool was_;
    };

    /// While one lives, the weights required are host tensors made by `allocate`, filled at once (never deferred):
    /// a network keeps them in host memory and copies them to the device when it runs them (model/layer_stream.h).
    class OnHost {
    public:
        OnHost(WeightLoader& loader, std::function<Tensor(const Shape&, DType)> allocate) : loader_(loader) {
            loader.host_alloc_ = std::move(allocate);
        }
        ~OnHost() { loader_.host_alloc_ = nullptr; }
        OnHost(const OnHost&) = delete;
        OnHost& operator=(const OnHost&) = delete;

    private:
        WeightLoader& loader_;
    };

    /// Keys of the source under `prefix` that no require() asked for (none when recording).
    std::vector<std::string> unused(const std::string& prefix) const;
    const std::set<std::string>& used() const { return used_; }
    /// Every require() and declare(), in call order.
    const std::vector<WeightDeclaration>& declarations() const { return declarations_; }
    bool recording() const { return source_ == nullptr; }
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
    void record(const std::string& key, const Shape& shape, WeightInit init, bool loaded, bool linear = false);
    /// A destination tensor: on the backend, or in host memory inside an OnHost scope.
    Tensor alloc(const Shape& shape, DType dtype);
    /// Copies `view` into t now (converting its dtype): an upload, or a host copy inside an OnHost scope.
    void put(const TensorView& view, const Tensor& t);
    /// Uploads `view` into t now, or queues it for finish() when deferred and the source knows its file range.
    void upload_or_defer(const std::string& key, const TensorView& view, const Tensor& t);
    /// The stored view of `key` with exactly `shape` (any float dtype, F8_E4M3 included); throws otherwise.
    TensorView stored(const std::string& key, const Shape& shape) const;

    const WeightSource* source_ = nullptr;
    Backend& backend_;
    std::set<std::string> used_;
    std::vector<WeightDeclaration> declarations_;
    bool declare_only_ = false;
    Precision precision_ = Precision::Bf16;
    std::optional<BulkLoadOptions> defer_;
    std::vector<BulkLoadItem> pending_;
    std::vector<Tensor> pending_tensors_;  // keep the destinations alive until finish()
    std::function<Tensor(const Shape&, DType)> host_alloc_;  // set inside an OnHost scope
};

}  // namespace dzr
