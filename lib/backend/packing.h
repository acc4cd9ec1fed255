#pragma once
/// Packed persistent allocations: while a PackedAllocations scope is open on a device that supports it, the
/// device's alloc() carves tensors out of one growing slab instead of giving each its own allocation.
///
/// Why: cudaMalloc backs every allocation with whole 2 MiB pages, so a tensor of 12.5 pages (an E4M3 [5120, 5120]
/// weight: 26,214,400 bytes) wastes half a page, and the DiT's 400 such weights waste 0.4 GiB (docs/MEMORY.md). A
/// slab maps physical pages only as far as its tensors reach: at most one partial page per network.
///
/// The slab lives as long as any tensor carved from it (a network's weights): when the last is freed (umT5 after
/// the text pre-pass), its memory goes back. Devices without the capability (CPU, measuring) ignore the scope.
#include "backend/backend.h"

namespace dzr {

/// What a DeviceContext that packs implements besides DeviceContext (a capability, asked by a cross-cast).
class PackingAllocator {
public:
    virtual ~PackingAllocator() = default;
    /// From here alloc() packs into a new slab (nested scopes share the outer one).
    virtual void begin_packing() = 0;
    /// Ends the current slab: later allocations get their own memory again. The slab stays until its last tensor
    /// is freed.
    virtual void end_packing() = 0;
};

/// Packs the allocations made on `be`'s device during its lifetime (a no-op where the device cannot).
class PackedAllocations {
public:
    explicit PackedAllocations(Backend& be) : packer_(dynamic_cast<PackingAllocator*>(&be.context())) {
        if (packer_) packer_->begin_packing();
    }
    ~PackedAllocations() {
        if (packer_) packer_->end_packing();
    }
    PackedAllocations(const PackedAllocations&) = delete;
    PackedAllocations& operator=(const PackedAllocations&) = delete;

private:
    PackingAllocator* packer_ = nullptr;
};

}  // namespace dzr
