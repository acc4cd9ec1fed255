#include "model/layer_stream.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace dzr {

namespace {

constexpr size_t kAlignment = 256;  // every tensor of a slot starts where a device allocation would

size_t align_up(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

std::vector<int> streamed_layers(int num_layers, int count) {
    DZR_CHECK(count >= 0 && count <= num_layers, "offload_layers {} is outside [0, {}] (the DiT's layers)", count,
              num_layers);
    std::vector<int> out;
    // NOTE: layer (k + 1) * L / (count + 1): the first copies have a gap of layers to run under, as do the others
    // (strictly ascending and below num_layers for every count <= num_layers)
    for (int k = 0; k < count; ++k) out.push_back(int((int64_t(k) + 1) * num_layers / (count + 1)));
    return out;
}

LayerStream::LayerStream(Backend& be, std::vector<int> layers) {
    if (layers.empty() || be.capabilities().measuring) return;
    DZR_CHECK(std::is_sorted(layers.begin(), layers.end()) &&
                  std::adjacent_find(layers.begin(), layers.end()) == layers.end() && layers.front() >= 0,
              "layer stream: the streamed layers must ascend");
    layers_ = std::move(layers);
    index_.assign(size_t(layers_.back()) + 1, -1);
    for (size_t k = 0; k < layers_.size(); ++k) index_[size_t(layers_[k])] = int(k);
    owner_ = &be;
    copy_ = be.make_copy_stream();
    start_ = copy_->make_event();
    for (size_t k = 0; k < layers_.size(); ++k) {
        ready_.push_back(copy_->make_event());
        done_.push_back(copy_->make_event());
    }
}

LayerStream::~LayerStream() {
    if (copy_) copy_->synchronize();  // no copy may still read the host buffers
}

LayerStream::LayerStream(LayerStream&&) noexcept = default;
LayerStream& LayerStream::operator=(LayerStream&&) noexcept = default;

void LayerStream::adopt(int layer, std::span<Tensor* const> tensors, size_t prefix) {
    const int k = index_of(layer);
    DZR_CHECK(k >= 0 && host_.size() == size_t(k), "layer stream: layer {} is not the next streamed layer", layer);
    std::vector<size_t> offsets;
    size_t bytes = 0, prefix_bytes = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        if (i == prefix) prefix_bytes = bytes;
        offsets.push_back(bytes);
        if (tensors[i]->defined()) bytes = align_up(bytes + tensors[i]->nbytes());
    }
    if (prefix >= tensors.size()) prefix_bytes = bytes;
    if (slots_.empty()) {
        layout_bytes_ = bytes;
        prefix_bytes_ = prefix_bytes;
        for (int s = 0; s < std::min(kSlots, count()); ++s) slots_.push_back(owner_->alloc(Shape{int64_t(bytes)}, DType::U8));
    }
    DZR_CHECK(bytes == layout_bytes_ && prefix_bytes == prefix_bytes_,
              "layer stream: layer {} takes {} bytes, the first streamed layer {}", layer, bytes, layout_bytes_);
    Tensor pinned = owner_->context().alloc_pinned(Shape{int64_t(bytes)}, DType::U8);
    const Tensor& slot = slots_[size_t(k % kSlots)];
    for (size_t i = 0; i < tensors.size(); ++i) {
        Tensor& t = *tensors[i];
        if (!t.defined()) continue;
        DZR_CHECK(t.view().is_contiguous() && !t.device().is_cuda(),
                  "layer stream: layer {}: {} is not a contiguous host tensor", layer, t.view().str());
        std::memcpy(static_cast<char*>(pinned.data()) + offsets[i], t.data(), t.nbytes());
        t = Tensor(slot.storage(),
                   TensorView(static_cast<char*>(slot.data()) + offsets[i], t.dtype(), t.shape(), slot.device()));
    }
    host_.push_back(std::move(pinned));
}

void LayerStream::issue(int k) const {
    const size_t bytes = part_ == Part::Prefix ? prefix_bytes_ : layout_bytes_;
    const TensorView dst = slots_[size_t(k % kSlots)].view().slice(0, 0, int64_t(bytes));
    copy_->copy_pinned(host_[size_t(k)].data(), dst);
    copy_->record(*ready_[size_t(k)]);
}

void LayerStream::begin(Backend& be, Part part) const {
    if (layers_.empty() || be.capabilities().measuring) return;
    DZR_CHECK(host_.size() == layers_.size(), "layer stream: {} of {} streamed layers loaded", host_.size(),
              layers_.size());
    part_ = part;
    // NOTE: the copies follow everything queued so far, the previous pass's reads of the slots included
    be.stream().record(*start_);
    copy_->wait(*start_);
    for (int k = 0; k < std::min(kSlots, count()); ++k) issue(k);
}

void LayerStream::before(Backend& be, int layer) const {
    const int k = index_of(layer);
    if (k < 0 || be.capabilities().measuring) return;
    be.stream().wait(*ready_[size_t(k)]);
}

void LayerStream::after(Backend& be, int layer) const {
    const int k = index_of(layer);
    if (k < 0 || be.capabilities().measuring || k + kSlots >= count()) return;
    be.stream().record(*done_[size_t(k)]);
    copy_->wait(*done_[size_t(k)]);
    issue(k + kSlots);
}

size_t LayerStream::slot_bytes() const { return slots_.size() * layout_bytes_; }

size_t LayerStream::host_bytes() const { return host_.size() * layout_bytes_; }

}  // namespace dzr
