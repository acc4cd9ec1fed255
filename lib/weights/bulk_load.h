#pragma once
/// Reading many tensors out of files at disk speed (loading a checkpoint). Module: weights (it uses core and
/// the backend's StagingRing only).
///
/// The tensors' stored byte ranges, sorted by file and offset, are cut into chunks of at most chunk_bytes of
/// consecutive file bytes. Reader threads take the chunks in file order and pread each one with one large
/// read:
///  - on a GPU into a pinned staging slot (backend/staging.h) whose copies into the tensors' final device
///    allocations go out on the ring's copy stream while the threads read the next chunks;
///  - on the CPU backend straight into the host tensors.
/// A tensor stored in another dtype than its destination's is read into the thread's own buffer and converted
/// into the slot (or the tensor) by convert_copy_host, the function Backend::upload converts with, so both
/// load paths give the same bits. Reads that come back short name the file and the tensor.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace dzr {

struct BulkLoadOptions {
    int threads = 0;                        ///< reader threads; 0: min(8, hardware threads)
    size_t chunk_bytes = size_t(64) << 20;  ///< the largest read (rounded up to 4096 bytes) and a slot's size
    int slots = 0;                          ///< pinned staging slots on a GPU; 0: threads + 2
    bool direct = false;  ///< O_DIRECT reads (past the page cache) where the file system allows
};

/// One tensor: where its stored bytes are and where they go.
struct BulkLoadItem {
    std::string key;  ///< for messages
    std::filesystem::path file;
    uint64_t offset = 0;         ///< of the stored tensor's first byte in the file
    DType stored = DType::BF16;  ///< the file's dtype; the file holds dst.numel() elements of it
    TensorView dst;              ///< contiguous, on the backend's device

    uint64_t stored_bytes() const { return uint64_t(dst.numel()) * dtype_size(stored); }
};

struct BulkLoadStats {
    uint64_t file_bytes = 0;    ///< tensor bytes read from the files
    uint64_t tensor_bytes = 0;  ///< bytes written into the tensors
    size_t tensors = 0, chunks = 0, files = 0;
    int threads = 0;
    int slots = 0;          ///< pinned staging slots (0: none, the CPU path)
    size_t slot_bytes = 0;  ///< each slot's size
    bool direct = false;    ///< every file was read with O_DIRECT
    double seconds = 0;  ///< wall time: staging allocation, reads, conversions and the wait for the last copy

    double gb_per_s() const { return seconds > 0 ? double(file_bytes) / seconds / 1e9 : 0.0; }
    /// "45.85 GB from 10 files in 9.21 s (4.98 GB/s): 8 threads, 10 x 64 MiB pinned staging, buffered reads"
    std::string summary() const;
};

/// A run of one piece of an item inside a chunk.
struct BulkPiece {
    size_t item = 0;
    uint64_t item_offset = 0;  ///< in the item's stored bytes
    uint64_t bytes = 0;        ///< stored bytes
};

/// Consecutive file bytes [offset, offset + bytes) of files[file], read with one read. A conversion chunk
/// holds one piece of one item (its stored and its converted bytes both fit in chunk_bytes); other chunks
/// hold pieces of same-dtype items back to back.
struct BulkChunk {
    size_t file = 0;
    uint64_t offset = 0, bytes = 0;
    bool convert = false;
    std::vector<BulkPiece> pieces;
};

struct BulkPlan {
    std::vector<std::filesystem::path> files;  ///< in order of first appearance among the sorted items
    std::vector<BulkChunk> chunks;             ///< sorted by file, then offset
};

/// The chunks bulk_load reads (exposed for tests). chunk_bytes is rounded up to a multiple of 4096.
BulkPlan plan_bulk_load(const std::vector<BulkLoadItem>& items, size_t chunk_bytes);

/// Reads every item's stored bytes into its destination on `be` and waits until they are there. Items may
/// repeat a file range (the same weight loaded twice). Throws dzr::Error naming the file (and the tensor)
/// when a file cannot be opened or read, or is shorter than an item's range; the destinations are then partly
/// written.
BulkLoadStats bulk_load(const std::vector<BulkLoadItem>& items, Backend& be, const BulkLoadOptions& options);

/// The reader threads `options` asks for (0: min(8, hardware threads)).
int bulk_load_threads(const BulkLoadOptions& options);

}  // namespace dzr
