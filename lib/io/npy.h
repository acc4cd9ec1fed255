#pragma once
/// NumPy .npy files (format versions 1.0, 2.0 and 3.0): a C-order array of one of the dtypes
/// <f2 <f4 <f8 |u1 <i4 <i8. Fortran order, big-endian and object dtypes are rejected with an error
/// that names the file. Writing produces version 1.0 (2.0 only when the header would not fit) and is
/// atomic (temporary file + rename).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace dzr::io {

enum class NpyDType : uint8_t { F2, F4, F8, U1, I4, I8 };

/// The descr string numpy writes ("<f4", "|u1", ...).
std::string_view npy_descr(NpyDType t);
/// A readable name ("float32", "uint8", ...).
std::string_view npy_dtype_name(NpyDType t);
size_t npy_dtype_size(NpyDType t);
bool npy_dtype_is_float(NpyDType t);

/// What the header of a .npy file says.
struct NpyHeader {
    int major = 1;
    int minor = 0;
    NpyDType dtype = NpyDType::F4;
    std::vector<int64_t> shape;
    size_t data_offset = 0;  // bytes before the array data (magic + version + length + header)

    int64_t numel() const;
    size_t data_bytes() const;
};

/// Parses the magic, version and header dict at the start of `bytes` (which must hold at least the
/// whole header). `name` (usually the file path) prefixes every error message.
NpyHeader parse_npy_header(std::string_view bytes, const std::string& name);

/// Encodes a version 1.0 header (2.0 when longer than 65535 bytes), padded to a multiple of 64.
std::string encode_npy_header(NpyDType dtype, const std::vector<int64_t>& shape);

/// A host array read from a .npy file: dtype, shape and 64-byte aligned data.
class NpyArray {
public:
    NpyArray() = default;
    /// Zero-filled array.
    NpyArray(NpyDType dtype, std::vector<int64_t> shape);

    NpyDType dtype() const { return dtype_; }
    const std::vector<int64_t>& shape() const { return shape_; }
    int rank() const { return int(shape_.size()); }
    int64_t dim(int i) const { return shape_[size_t(i < 0 ? i + rank() : i)]; }
    int64_t numel() const;
    size_t nbytes() const { return size_t(numel()) * npy_dtype_size(dtype_); }
    void* data() const { return storage_ ? storage_->data() : nullptr; }
    template <typename T>
    T* ptr() const {
        return static_cast<T*>(data());
    }
    std::string shape_str() const;  // "[419, 7]"
    std::string describe() const;   // "float32 [419, 7]"

    /// Every element converted to double / float (floats and integers; C order).
    std::vector<double> to_f64() const;
    std::vector<float> to_f32() const;

    /// A Tensor sharing this array's memory (f2 -> F16, f4 -> F32, u1 -> U8, i4 -> I32, i8 -> I64);
    /// f8 is converted to a new F32 tensor since dzr has no f64 dtype. Rank must be 1..6.
    Tensor to_tensor() const;

private:
    NpyDType dtype_ = NpyDType::F4;
    std::vector<int64_t> shape_;
    std::shared_ptr<HostStorage> storage_;
};

/// Reads only the header of a .npy file (its shape and dtype without the data). Errors name the file.
NpyHeader read_npy_header(const std::filesystem::path& path);

/// Reads a .npy file. Errors name the file and say what was expected and what was found.
NpyArray read_npy(const std::filesystem::path& path);
/// Parses a .npy image held in memory (`name` is used in error messages).
NpyArray parse_npy(std::string_view bytes, const std::string& name);

/// Writes `bytes` of C-order data as a .npy file, atomically.
void write_npy(const std::filesystem::path& path, NpyDType dtype, const std::vector<int64_t>& shape,
               const void* data);
void write_npy(const std::filesystem::path& path, const NpyArray& array);
/// Writes a contiguous host tensor (F32, F16, U8, I32, I64; BF16 and F8 have no NPY dtype).
void write_npy(const std::filesystem::path& path, const TensorView& view);
void write_npy_f32(const std::filesystem::path& path, const std::vector<int64_t>& shape,
                   std::span<const float> values);
void write_npy_f64(const std::filesystem::path& path, const std::vector<int64_t>& shape,
                   std::span<const double> values);

}  // namespace dzr::io
