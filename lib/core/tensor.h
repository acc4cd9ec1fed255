#pragma once
/// Tensors: a non-owning TensorView (data, dtype, shape, strides, device) and an owning Tensor
/// that keeps its Storage alive (host heap, CUDA memory, a slice of an mmapped file).
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace dzr {

enum class DeviceKind : uint8_t { Cpu, Cuda };

struct Device {
    DeviceKind kind = DeviceKind::Cpu;
    int index = 0;

    static Device cpu() { return {DeviceKind::Cpu, 0}; }
    static Device cuda(int i = 0) { return {DeviceKind::Cuda, i}; }
    bool is_cpu() const { return kind == DeviceKind::Cpu; }
    bool is_cuda() const { return kind == DeviceKind::Cuda; }
    std::string str() const;  // "cpu", "cuda:0"
    bool operator==(const Device&) const = default;
};

/// Parses "cpu", "cuda", "cuda:N". Throws dzr::Error otherwise.
Device parse_device(const std::string& s);
/// Parses a comma-separated list of devices ("cpu,cpu", "cuda:0,cuda:1"). Throws dzr::Error naming the list.
std::vector<Device> parse_device_list(const std::string& s);

inline constexpr int kMaxDims = 6;

/// A small fixed-capacity list of extents (or strides), outermost first.
class Shape {
public:
    Shape() = default;
    Shape(std::initializer_list<int64_t> dims);
    explicit Shape(const std::vector<int64_t>& dims);

    int rank() const { return rank_; }
    int64_t operator[](int i) const { return d_[i < 0 ? i + rank_ : i]; }
    int64_t& operator[](int i) { return d_[i < 0 ? i + rank_ : i]; }
    int64_t numel() const;
    std::vector<int64_t> vec() const { return {d_.begin(), d_.begin() + rank_}; }
    std::string str() const;  // "[2, 3, 4]"
    bool operator==(const Shape& o) const;
    bool operator!=(const Shape& o) const { return !(*this == o); }

    /// Row-major (C-order) strides in elements for this shape.
    Shape contiguous_strides() const;

private:
    std::array<int64_t, kMaxDims> d_{};
    int rank_ = 0;
};

/// A view into memory: no ownership. Strides are in elements.
struct TensorView {
    void* data = nullptr;
    DType dtype = DType::F32;
    Shape shape;
    Shape strides;
    Device device;

    TensorView() = default;
    TensorView(void* data, DType dtype, Shape shape, Device device = Device::cpu());
    TensorView(void* data, DType dtype, Shape shape, Shape strides, Device device);

    bool defined() const { return data != nullptr || (shape.rank() > 0 && shape.numel() == 0); }
    int rank() const { return shape.rank(); }
    int64_t numel() const { return shape.numel(); }
    int64_t dim(int i) const { return shape[i]; }
    size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
    bool is_contiguous() const;

    /// Rows and columns when seen as a matrix [numel / last, last] (contiguous views).
    int64_t cols() const { return rank() == 0 ? 1 : shape[-1]; }
    int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }

    template <typename T>
    T* ptr() const {
        return static_cast<T*>(data);
    }

    /// Same memory, new shape (needs a contiguous view).
    TensorView reshape(Shape new_shape) const;
    /// Elements [start, start+len) along dimension dim.
    TensorView slice(int dim, int64_t start, int64_t len) const;
    /// Swap two dimensions (strided view, no copy).
    TensorView transpose(int d0, int d1) const;
    /// Reorder dimensions: out dim i = in dim perm[i] (strided view, no copy).
    TensorView permute(std::initializer_list<int> perm) const;

    std::string str() const;  // "bf16[2, 3] cuda:0"
};

/// Backing memory of a Tensor. Subclasses free what they own.
class Storage {
public:
    virtual ~Storage() = default;
    virtual void* data() const = 0;
    virtual size_t bytes() const = 0;
    virtual Device device() const = 0;
};

/// Host memory: its own heap block (64-byte aligned, zero-filled), or memory another allocator made (page-locked
/// memory from the CUDA runtime) that `release` frees.
class HostStorage final : public Storage {
public:
    explicit HostStorage(size_t bytes);
    HostStorage(void* ptr, size_t bytes, void (*release)(void*)) : ptr_(ptr), bytes_(bytes), release_(release) {}
    ~HostStorage() override;
    HostStorage(const HostStorage&) = delete;
    HostStorage& operator=(const HostStorage&) = delete;
    void* data() const override { return ptr_; }
    size_t bytes() const override { return bytes_; }
    Device device() const override { return Device::cpu(); }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
    void (*release_)(void*) = nullptr;  // null: std::free
};

/// An owning tensor: a view plus the storage it points into (which may be shared).
class Tensor {
public:
    Tensor() = default;
    Tensor(std::shared_ptr<Storage> storage, TensorView view)
        : storage_(std::move(storage)), view_(view) {}

    /// Zero-filled contiguous host tensor.
    static Tensor host(Shape shape, DType dtype);
    /// Host tensor holding a copy of `values` (f32).
    static Tensor host_f32(Shape shape, const std::vector<float>& values);

    const TensorView& view() const { return view_; }
    operator const TensorView&() const { return view_; }
    bool defined() const { return view_.defined(); }
    void* data() const { return view_.data; }
    DType dtype() const { return view_.dtype; }
    const Shape& shape() const { return view_.shape; }
    Device device() const { return view_.device; }
    int64_t numel() const { return view_.numel(); }
    size_t nbytes() const { return view_.nbytes(); }
    const std::shared_ptr<Storage>& storage() const { return storage_; }
    template <typename T>
    T* ptr() const {
        return view_.ptr<T>();
    }

private:
    std::shared_ptr<Storage> storage_;
    TensorView view_;
};

/// Copy a host view of any float dtype into f32 values (strided views allowed).
std::vector<float> to_f32_vector(const TensorView& host_view);

}  // namespace dzr
