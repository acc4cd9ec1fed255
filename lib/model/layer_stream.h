#pragma once
/// DiT layers whose weights stay in host memory and are copied to the device just before they run
/// (`offload_layers`): a run that does not fit its GPU with every layer resident streams a few of them, and the
/// numbers do not change (the same bytes reach the same kernels at the same alignment). docs/MEMORY.md.
///
/// The streamed layers take turns in kSlots device buffers. A pass over the layers (a forward, a cross-K/V
/// projection) queues the first copies on the backend's copy stream when it begins; a streamed layer's end frees its
/// slot for the copy of the streamed layer kSlots after it, so each copy runs under the compute of the layers
/// between. Every ordering is an event between the two streams, so a CUDA graph captured from the pass holds the
/// copies too.
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace dzr {

/// The layers streamed when `count` of `num_layers` are: spread evenly, the first a gap into the pass, so every
/// copy has layers to run under. Empty for count 0; throws for count outside [0, num_layers].
std::vector<int> streamed_layers(int num_layers, int count);

class LayerStream {
public:
    static constexpr int kSlots = 2;
    /// What a pass copies of each streamed layer: all of it, or the tensors adopt() put first (the cross-attention's
    /// K/V projections: all that a cross-K/V pass reads).
    enum class Part { Whole, Prefix };

    LayerStream() = default;
    /// Streams `layers` (ascending) of a DiT on `be`; none on a measuring backend (a plan counts them itself).
    LayerStream(Backend& be, std::vector<int> layers);
    ~LayerStream();
    LayerStream(LayerStream&&) noexcept;
    LayerStream& operator=(LayerStream&&) noexcept;

    bool streams(int layer) const { return index_of(layer) >= 0; }
    int count() const { return int(layers_.size()); }
    const std::vector<int>& layers() const { return layers_; }
    /// Takes over a streamed layer's host tensors (loaded under WeightLoader::OnHost), in the order given (undefined
    /// ones skipped): copies them into one pinned host buffer and points each at its place in the layer's slot. The
    /// first `prefix` tensors are the Part::Prefix. Layers are adopted in ascending order, all with one layout.
    void adopt(int layer, std::span<Tensor* const> tensors, size_t prefix);

    /// A pass over the layers in order: begin(), then before(i) and after(i) around each layer i. No-ops on a
    /// measuring backend and without streamed layers.
    void begin(Backend& be, Part part) const;
    void before(Backend& be, int layer) const;
    void after(Backend& be, int layer) const;

    /// Device bytes of the slots; pinned host bytes of the streamed layers.
    size_t slot_bytes() const;
    size_t host_bytes() const;

private:
    int index_of(int layer) const {
        return layer >= 0 && size_t(layer) < index_.size() ? index_[size_t(layer)] : -1;
    }
    /// Queues streamed layer k's copy into its slot on the copy stream.
    void issue(int k) const;

    Backend* owner_ = nullptr;  // the DiT's backend: the slots, the pinned memory, the copy stream
    std::vector<int> layers_;
    std::vector<int> index_;          // per layer: its place in layers_, or -1 when resident
    std::vector<Tensor> host_;        // per streamed layer: its pinned bytes
    std::vector<Tensor> slots_;       // kSlots device buffers of layout_bytes_
    size_t layout_bytes_ = 0, prefix_bytes_ = 0;
    std::unique_ptr<Stream> copy_;
    std::unique_ptr<Event> start_;
    std::vector<std::unique_ptr<Event>> ready_, done_;  // per streamed layer: copied; run (its slot free)
    mutable Part part_ = Part::Whole;
};

}  // namespace dzr
