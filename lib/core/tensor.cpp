#include "core/tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/convert.h"

namespace dzr {

std::string Device::str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }

Device parse_device(const std::string& s) {
    if (s == "cpu") return Device::cpu();
    if (s == "cuda") return Device::cuda(0);
    if (s.rfind("cuda:", 0) == 0) {
        const std::string n = s.substr(5);
        DZR_CHECK(!n.empty() && n.find_first_not_of("0123456789") == std::string::npos && n.size() < 4,
                  "invalid device '{}' (use cpu, cuda or cuda:N)", s);
        return Device::cuda(std::stoi(n));
    }
    DZR_THROW("invalid device '{}' (use cpu, cuda or cuda:N)", s);
}

std::vector<Device> parse_device_list(const std::string& s) {
    std::vector<Device> out;
    size_t start = 0;
    while (true) {
        const size_t comma = s.find(',', start);
        const std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        DZR_CHECK(!part.empty(), "invalid device list '{}' (use cpu, cuda:N or two of them: cpu,cpu, cuda:0,cuda:1)", s);
        out.push_back(parse_device(part));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

Shape::Shape(std::initializer_list<int64_t> dims) {
    DZR_CHECK(dims.size() <= size_t(kMaxDims), "tensor rank {} exceeds the maximum of {}", dims.size(),
              kMaxDims);
    for (int64_t v : dims) d_[rank_++] = v;
}

Shape::Shape(const std::vector<int64_t>& dims) {
    DZR_CHECK(dims.size() <= size_t(kMaxDims), "tensor rank {} exceeds the maximum of {}", dims.size(),
              kMaxDims);
    for (int64_t v : dims) d_[rank_++] = v;
}

int64_t Shape::numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= d_[i];
    return n;
}

std::string Shape::str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(d_[i]);
    return s + "]";
}

bool Shape::operator==(const Shape& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
        if (d_[i] != o.d_[i]) return false;
    return true;
}

Shape Shape::contiguous_strides() const {
    Shape s = *this;
    int64_t acc = 1;
    for (int i = rank_ - 1; i >= 0; --i) {
        s.d_[i] = acc;
        acc *= d_[i];
    }
    return s;
}

TensorView::TensorView(void* data_, DType dtype_, Shape shape_, Device device_)
    : data(data_), dtype(dtype_), shape(shape_), strides(shape_.contiguous_strides()), device(device_) {}

TensorView::TensorView(void* data_, DType dtype_, Shape shape_, Shape strides_, Device device_)
    : data(data_), dtype(dtype_), shape(shape_), strides(strides_), device(device_) {
    DZR_ASSERT(shape.rank() == strides.rank());
}

bool TensorView::is_contiguous() const {
    int64_t acc = 1;
    for (int i = rank() - 1; i >= 0; --i) {
        if (shape[i] != 1 && strides[i] != acc) return false;
        acc *= shape[i];
    }
    return true;
}

TensorView TensorView::reshape(Shape new_shape) const {
    DZR_ASSERT(is_contiguous());
    DZR_CHECK(new_shape.numel() == numel(), "cannot reshape {} to {}", shape.str(), new_shape.str());
    return TensorView(data, dtype, new_shape, device);
}

TensorView TensorView::slice(int d, int64_t start, int64_t len) const {
    if (d < 0) d += rank();
    DZR_ASSERT(d >= 0 && d < rank());
    DZR_ASSERT(start >= 0 && len >= 0 && start + len <= shape[d]);
    TensorView v = *this;
    v.data = static_cast<char*>(data) + start * strides[d] * int64_t(dtype_size(dtype));
    v.shape[d] = len;
    return v;
}

TensorView TensorView::transpose(int d0, int d1) const {
    if (d0 < 0) d0 += rank();
    if (d1 < 0) d1 += rank();
    TensorView v = *this;
    std::swap(v.shape[d0], v.shape[d1]);
    std::swap(v.strides[d0], v.strides[d1]);
    return v;
}

TensorView TensorView::permute(std::initializer_list<int> perm) const {
    DZR_ASSERT(int(perm.size()) == rank());
    TensorView v = *this;
    int i = 0;
    for (int p : perm) {
        v.shape[i] = shape[p];
        v.strides[i] = strides[p];
        ++i;
    }
    return v;
}

std::string TensorView::str() const {
    return fmt::format("{}{} {}", dtype_name(dtype), shape.str(), device.str());
}

HostStorage::HostStorage(size_t bytes) : bytes_(bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    ptr_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!ptr_) DZR_THROW("out of host memory allocating {} bytes", bytes);
    std::memset(ptr_, 0, rounded == 0 ? 64 : rounded);
}

HostStorage::~HostStorage() {
    if (release_ == nullptr)
        std::free(ptr_);
    else if (ptr_ != nullptr)
        release_(ptr_);
}

Tensor Tensor::host(Shape shape, DType dtype) {
    auto st = std::make_shared<HostStorage>(size_t(shape.numel()) * dtype_size(dtype));
    return Tensor(st, TensorView(st->data(), dtype, shape, Device::cpu()));
}

Tensor Tensor::host_f32(Shape shape, const std::vector<float>& values) {
    DZR_ASSERT(int64_t(values.size()) == shape.numel());
    Tensor t = host(shape, DType::F32);
    std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
    return t;
}

std::vector<float> to_f32_vector(const TensorView& v) {
    std::vector<float> out(size_t(v.numel()));
    convert_copy_host(v, TensorView(out.data(), DType::F32, Shape{v.numel()}, Device::cpu()));
    return out;
}

}  // namespace dzr
