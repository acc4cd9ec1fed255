#pragma once
/// Where model code gets its weights. A WeightSource resolves a checkpoint key (used verbatim, e.g.
/// "action_head.model.blocks.3.self_attn.q.weight") to a host view of the stored bytes. Models call
/// WeightLoader::require() once per weight at load and keep typed members; nothing is looked up by
/// string inside a forward.
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/precision.h"
#include "core/tensor.h"
#include "weights/weight_init.h"

namespace dzr {

class WeightSource {
public:
    virtual ~WeightSource() = default;
    /// Host view of the stored tensor (any dtype), or nullopt when absent.
    virtual std::optional<TensorView> find(const std::string& key) const = 0;
    /// Every key the source holds.
    virtual std::vector<std::string> keys() const = 0;
    /// Where the key lives, for messages ("model-00003-of-00010.safetensors").
    virtual std::string location(const std::string& key) const = 0;
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
class WeightLoader {
public:
    WeightLoader(const WeightSource& source, Backend& backend) : source_(&source), backend_(backend) {}
    /// A recording loader.
    explicit WeightLoader(Backend& backend) : backend_(backend) {}

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

    /// Keys of the source under `prefix` that no require() asked for (none when recording).
    std::vector<std::string> unused(const std::string& prefix) const;
    const std::set<std::string>& used() const { return used_; }
    /// Every require() and declare(), in call order.
    const std::vector<WeightDeclaration>& declarations() const { return declarations_; }
    bool recording() const { return source_ == nullptr; }
    Backend& backend() { return backend_; }

private:
    void record(const std::string& key, const Shape& shape, WeightInit init, bool loaded, bool linear = false);
    /// The stored view of `key` with exactly `shape` (any float dtype, F8_E4M3 included); throws otherwise.
    TensorView stored(const std::string& key, const Shape& shape) const;

    const WeightSource* source_ = nullptr;
    Backend& backend_;
    std::set<std::string> used_;
    std::vector<WeightDeclaration> declarations_;
    bool declare_only_ = false;
    Precision precision_ = Precision::Bf16;
};

}  // namespace dzr
