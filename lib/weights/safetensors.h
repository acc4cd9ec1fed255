#pragma once
/// safetensors files: a strict reader over a read-only memory mapping and an atomic writer.
///
/// Layout: 8-byte little-endian header length N, N bytes of JSON (an object, space-padded), then the
/// data buffer. Each header entry {"dtype", "shape", "data_offsets": [begin, end]} addresses bytes of
/// the data buffer; the entries must tile the buffer exactly (sorted, no overlap, no hole).
/// docs/CHECKPOINTS.md lists every rule the reader enforces.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dzr {

/// The largest header the reader accepts (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

/// A read-only private mapping of a whole file. As a Storage it lets Tensors point into the file and
/// keeps the mapping alive for as long as any of them exists.
class MappedFile final : public Storage {
  public:
    /// Maps `path` (open + fstat + mmap PROT_READ, MAP_PRIVATE). Throws dzr::Error naming the file.
    explicit MappedFile(const std::filesystem::path& path);
    ~MappedFile() override;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    void* data() const override { return data_; }
    size_t bytes() const override { return size_; }
    Device device() const override { return Device::cpu(); }
    const uint8_t* bytes_ptr() const { return static_cast<const uint8_t*>(data_); }
    const std::filesystem::path& path() const { return path_; }

  private:
    std::filesystem::path path_;
    void* data_ = nullptr;
    size_t size_ = 0;
};

/// One header entry. Offsets are relative to the start of the data buffer.
struct SafetensorsEntry {
    std::string name;
    DType dtype = DType::F32;
    Shape shape;
    uint64_t begin = 0;
    uint64_t end = 0;

    uint64_t nbytes() const { return end - begin; }
};

/// A validated safetensors file. Opening checks the whole header against the data buffer; views
/// returned afterwards point into the mapping (read-only memory: never write through them).
class SafetensorsFile {
  public:
    /// Opens and validates `path`. Throws dzr::Error naming the file (and the tensor) on any violation.
    static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);

    const std::filesystem::path& path() const { return path_; }
    /// Entries sorted by data offset.
    const std::vector<SafetensorsEntry>& entries() const { return entries_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    const SafetensorsEntry* entry(const std::string& name) const;
    bool contains(const std::string& name) const { return entry(name) != nullptr; }

    /// A host view of the stored bytes, or nullopt when the file has no such tensor.
    std::optional<TensorView> find(const std::string& name) const;
    /// An owning tensor (shares the mapping). Throws when absent.
    Tensor tensor(const std::string& name) const;

    uint64_t file_size() const { return map_->bytes(); }
    uint64_t header_size() const { return header_size_; }
    /// Byte offset of the data buffer in the file (8 + header length).
    uint64_t data_offset() const { return 8 + header_size_; }
    uint64_t data_size() const { return file_size() - data_offset(); }
    const std::shared_ptr<MappedFile>& mapping() const { return map_; }

  private:
    SafetensorsFile() = default;
    TensorView view_of(const SafetensorsEntry& e) const;

    std::filesystem::path path_;
    std::shared_ptr<MappedFile> map_;
    uint64_t header_size_ = 0;
    std::vector<SafetensorsEntry> entries_;
    std::map<std::string, size_t> index_;  // name -> position in entries_
    std::map<std::string, std::string> metadata_;
};

/// What the writer needs to lay out one tensor before its bytes exist.
struct SafetensorsTensorSpec {
    std::string name;
    DType dtype = DType::F32;
    Shape shape;

    uint64_t nbytes() const { return uint64_t(shape.numel()) * dtype_size(dtype); }
};

/// Produces the bytes of tensor `index` (an index into the spec list given to the writer) into `out`,
/// which is already sized to exactly the tensor's byte count.
using SafetensorsFill = std::function<void(size_t index, std::vector<uint8_t>& out)>;

/// Writes a safetensors file: header entries and data in key order, header padded with spaces so the
/// data starts 8-byte aligned. Writes `path` + ".tmp-<pid>" and renames it over `path`, so readers
/// never see a partial file; the temp file is removed on failure. Throws dzr::Error naming the file.
void write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsTensorSpec>& specs,
                       const std::map<std::string, std::string>& metadata, const SafetensorsFill& fill);

/// Convenience: writes host tensors (any dtype, contiguous or strided) with their names.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// The header JSON text the writer produces for these specs, without the length prefix or padding
/// (exposed for tests that build broken files by editing a valid header).
std::string safetensors_header_json(const std::vector<SafetensorsTensorSpec>& specs,
                                    const std::map<std::string, std::string>& metadata);

}  // namespace dzr
