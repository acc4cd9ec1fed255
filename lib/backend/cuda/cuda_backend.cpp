// The CUDA backend: memory, transfers and the kernel-backed ops. GEMM and attention live in
// cuda_gemm.cpp, conv3d in cuda_conv.cpp.
#include "backend/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda_archs.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_paged_sdpa.h"
#include "core/convert.h"
#include "core/parallel.h"
#include "kernels/activation.cuh"
#include "kernels/convert.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/fp8.cuh"
#include "kernels/norm.cuh"
#include "kernels/reduce.cuh"
#include "kernels/dit_fused.cuh"
#include "kernels/rope.cuh"
#include "kernels/resize.cuh"
#include "kernels/softmax.cuh"
#include "kernels/vae_norm.cuh"

namespace dzr {

namespace cuda_detail {

void throw_library_error(const char* lib, int code, const char* what, const char* expr, const char* file, int line) {
    int device = -1;
    cudaGetDevice(&device);
    throw Error(fmt::format("{} error {} ({}) in `{}` at {}:{} on cuda:{}", lib, code, what ? what : "?", expr, file,
                            line, device));
}

}  // namespace cuda_detail

namespace {

using cuda_detail::DeviceGuard;
using cuda_detail::is_float_act;

/// Device memory from one cudaMalloc, freed with the tensor's last reference.
class CudaStorage final : public Storage {
public:
    CudaStorage(size_t bytes, int index) : bytes_(bytes), index_(index) {
        if (bytes == 0) return;
        DeviceGuard guard(index);
        const cudaError_t st = cudaMalloc(&ptr_, bytes);
        if (st != cudaSuccess) {
            cudaGetLastError();  // NOTE: clears the sticky out-of-memory status so later calls still work
            size_t free_bytes = 0, total = 0;
            cudaMemGetInfo(&free_bytes, &total);
            DZR_THROW("cuda:{}: cannot allocate {} bytes ({}); {} of {} bytes free", index, bytes,
                      cudaGetErrorString(st), free_bytes, total);
        }
    }
    ~CudaStorage() override {
        if (!ptr_) return;
        int prev = 0;
        cudaGetDevice(&prev);
        if (prev != index_) cudaSetDevice(index_);
        cudaFree(ptr_);
        if (prev != index_) cudaSetDevice(prev);
    }
    CudaStorage(const CudaStorage&) = delete;
    CudaStorage& operator=(const CudaStorage&) = delete;
    void* data() const override { return ptr_; }
    size_t bytes() const override { return bytes_; }
    Device device() const override { return Device::cuda(index_); }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
    int index_ = 0;
};

/// Page-locked host memory (cudaHostAlloc), zero-filled: the device copies from it asynchronously.
std::shared_ptr<Storage> pinned_storage(size_t bytes) {
    void* ptr = nullptr;
    if (bytes > 0) {
        const cudaError_t st = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
        if (st != cudaSuccess) {
            cudaGetLastError();
            DZR_THROW("cannot allocate {} bytes of page-locked host memory ({})", bytes, cudaGetErrorString(st));
        }
        std::memset(ptr, 0, bytes);
    }
    return std::make_shared<HostStorage>(ptr, bytes, [](void* p) { cudaFreeHost(p); });
}

void require_float(const TensorView& t, const char* op, const char* what) {
    DZR_CHECK(is_float_act(t.dtype), "cuda backend: {} needs an f32 or bf16 {}, got {}", op, what, t.str());
}

void require_contiguous(const TensorView& t, const char* op, const char* what) {
    DZR_CHECK(t.is_contiguous(), "cuda backend: {} needs a contiguous {} ({})", op, what, t.str());
}

/// An optional per-channel parameter: absent, or f32/bf16 contiguous with n elements.
void check_param(const TensorView& t, int64_t n, const char* op, const char* what) {
    if (!t.defined()) return;
    require_float(t, op, what);
    require_contiguous(t, op, what);
    DZR_CHECK(t.numel() == n, "cuda backend: {} {} {} does not match {} channels", op, what, t.str(), n);
}

/// b broadcasts onto a when b has a's shape, a single element, or (ignoring leading 1s) a trailing
/// part of a's shape.
bool broadcastable(const TensorView& a, const TensorView& b) {
    if (b.numel() == 1 || b.shape == a.shape) return true;
    int rb = b.rank();
    while (rb > 0 && b.shape[b.rank() - rb] == 1) --rb;  // rb = rank without leading 1s
    if (rb > a.rank() || b.numel() == 0) return false;
    for (int i = 1; i <= rb; ++i)
        if (b.shape[-i] != a.shape[-i]) return false;
    return true;
}

}  // namespace

// ---- device ------------------------------------------------------------------------------------

CudaDevice::CudaDevice(int index, bool pack_weights) : index_(index), pack_weights_(pack_weights) {
    int count = 0;
    DZR_CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count > 0, "no CUDA device is visible");
    DZR_CHECK(index >= 0 && index < count, "cuda:{} does not exist ({} device(s) visible)", index, count);
    cudaDeviceProp prop{};
    DZR_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    caps_.resize_bicubic = true;
    caps_.paged_kv = true;
    caps_.device_events = true;
    caps_.graphs = true;
    caps_.conv_channels_last = true;
    caps_.compute_capability = prop.major * 10 + prop.minor;
    caps_.fp8 = caps_.compute_capability >= 89;
#ifdef DZR_CUDA_ARCHS
    DZR_CHECK(cuda_archs_cover(DZR_CUDA_ARCHS, caps_.compute_capability),
              "cuda:{} is {} (compute capability {}.{}), but this dzr's CUDA kernels were built for {} only: rebuild "
              "with -DCMAKE_CUDA_ARCHITECTURES={}{} (scripts/test.sh on a machine without a GPU builds for 90a alone)",
              index, prop.name, prop.major, prop.minor, DZR_CUDA_ARCHS, prop.major, prop.minor);
#endif
}

CudaDevice::~CudaDevice() {
    if (!workspace_base_) return;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(index_);
    cudaFree(workspace_base_);
    cudaSetDevice(prev);
}

Tensor CudaDevice::alloc(Shape shape, DType dtype) {
    if (slab_) {
        Tensor packed = alloc_packed(shape, dtype);
        if (packed.defined()) return packed;
    }
    const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
    auto storage = std::make_shared<CudaStorage>(bytes, index_);
    if (bytes > 0) {
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaMemsetAsync(storage->data(), 0, bytes, stream_));
    }
    return Tensor(storage, TensorView(storage->data(), dtype, shape, device()));
}

Tensor CudaDevice::alloc_pinned(Shape shape, DType dtype) {
    auto storage = pinned_storage(size_t(shape.numel()) * dtype_size(dtype));
    return Tensor(storage, TensorView(storage->data(), dtype, shape, Device::cpu()));
}

void CudaDevice::reserve_workspace(size_t bytes) {
    DeviceGuard guard(index_);
    if (workspace_base_) {
        DZR_CUDA_CHECK(cudaDeviceSynchronize());
        DZR_CUDA_CHECK(cudaFree(workspace_base_));
        workspace_base_ = nullptr;
    }
    arena_ = Arena();
    if (bytes == 0) bytes = CudaBackend::kDefaultWorkspaceBytes;
    const cudaError_t st = cudaMalloc(&workspace_base_, bytes);
    if (st != cudaSuccess) {
        cudaGetLastError();
        workspace_base_ = nullptr;
        DZR_THROW("cuda:{}: cannot reserve a {} byte workspace ({})", index_, bytes, cudaGetErrorString(st));
    }
    arena_ = Arena(workspace_base_, bytes, device());
}

std::pair<size_t, size_t> CudaDevice::memory_info() const {
    DeviceGuard guard(index_);
    size_t free_bytes = 0, total = 0;
    DZR_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return {free_bytes, total};
}

std::optional<int64_t> CudaDevice::memory_in_use() const {
    const auto [free_bytes, total] = memory_info();
    return int64_t(total - free_bytes);
}

std::optional<int64_t> CudaDevice::memory_free() const { return int64_t(memory_info().first); }

std::string CudaDevice::pci_bus_id() const {
    char id[32] = {0};
    if (cudaDeviceGetPCIBusId(id, int(sizeof(id)), index_) != cudaSuccess) {
        cudaGetLastError();  // NOTE: not sticky; cleared so a later check does not report it
        return {};
    }
    return id;
}

// ---- stream ------------------------------------------------------------------------------------

namespace {

/// A CUDA event with timing.
struct CudaEvent final : Event {
    cudaEvent_t ev = nullptr;
    ~CudaEvent() override {
        if (ev) cudaEventDestroy(ev);
    }
};

const CudaEvent& cuda_event(const Event& e) {
    const auto* c = dynamic_cast<const CudaEvent*>(&e);
    DZR_CHECK(c != nullptr, "cuda stream: the event was not made by a CUDA stream");
    return *c;
}

}  // namespace

CudaStream::CudaStream(CudaDevice& device, std::function<void(const TensorView&, const TensorView&)> gather)
    : device_(device), gather_(std::move(gather)) {
    DeviceGuard guard(device_.index());
    DZR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int i = 0; i < 2; ++i) {
        DZR_CUDA_CHECK(cudaHostAlloc(&staging_[i], kStagingBytes, cudaHostAllocDefault));
        DZR_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_[i], cudaEventDisableTiming));
    }
    small_uploads_ = std::make_unique<cuda_detail::PinnedUploadRing>(device_.index());
}

CudaStream::~CudaStream() {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_.index());
    if (stream_) cudaStreamSynchronize(stream_);
    small_uploads_.reset();
    for (int i = 0; i < 2; ++i) {
        if (staging_[i]) cudaFreeHost(staging_[i]);
        if (staging_done_[i]) cudaEventDestroy(staging_done_[i]);
    }
    if (stream_) cudaStreamDestroy(stream_);
    cudaSetDevice(prev);
}

void CudaStream::upload(const TensorView& host_src, const TensorView& dst) {
    DZR_CHECK(host_src.device.is_cpu(), "cuda backend: upload needs a host source, got {}", host_src.str());
    DZR_CHECK(dst.device == device_.device() && (dst.data != nullptr || dst.numel() == 0),
              "cuda backend: upload into {}: expected a tensor on {}", dst.str(), device_.device().str());
    DZR_CHECK(dst.is_contiguous(), "cuda backend: upload needs a contiguous dst ({})", dst.str());
    DZR_CHECK(host_src.numel() == dst.numel(), "cuda backend: upload of {} into {}: element counts differ",
              host_src.str(), dst.str());
    DZR_CHECK(!capturing(), "cuda backend: upload of {} inside a graph capture (a forward must take its host data "
              "before the capture)", host_src.str());
    DeviceGuard guard(device_.index());
    if (host_src.is_contiguous() && dst.nbytes() <= cuda_detail::PinnedUploadRing::kSlotBytes && dst.numel() > 0) {
        // NOTE: a small upload takes a pinned slot of its own, so it does not wait for earlier uploads
        void* slot = small_uploads_->acquire();
        convert_copy_host(host_src.reshape(Shape{host_src.numel()}), TensorView(slot, dst.dtype, Shape{dst.numel()}, Device::cpu()));
        small_uploads_->copy(dst.data, dst.nbytes(), stream_);
        return;
    }
    // NOTE: a strided host source is made contiguous first, so the chunks below are plain ranges.
    std::vector<char> packed;
    TensorView src = host_src;
    if (!src.is_contiguous()) {
        packed.resize(src.nbytes());
        TensorView tmp(packed.data(), src.dtype, src.shape, Device::cpu());
        convert_copy_host(src, tmp);
        src = tmp;
    }
    const int64_t n = dst.numel(), chunk = int64_t(kStagingBytes / dtype_size(dst.dtype));
    const size_t es = dtype_size(src.dtype), ed = dtype_size(dst.dtype);
    for (int64_t off = 0; off < n; off += chunk) {
        const int64_t len = std::min(chunk, n - off);
        const int s = next_staging_;
        next_staging_ ^= 1;
        // Wait until the copy that last read this staging buffer is done before overwriting it.
        DZR_CUDA_CHECK(cudaEventSynchronize(staging_done_[s]));
        // NOTE: a large chunk (a call's 12 MB clip) is copied into the pinned buffer by several threads: one
        // thread's copy took ~2 ms of the call, the device idle meanwhile (docs/PERF.md, "Host side")
        constexpr int64_t kPieceBytes = int64_t(1) << 20;
        const int64_t piece = std::max<int64_t>(1, kPieceBytes / int64_t(std::max(es, ed)));
        const size_t pieces = size_t((len + piece - 1) / piece);
        parallel_for(pieces, worker_threads(pieces, 8), [&](size_t p) {
            const int64_t o = int64_t(p) * piece, l = std::min(piece, len - o);
            TensorView from(static_cast<char*>(src.data) + (off + o) * int64_t(es), src.dtype, Shape{l}, Device::cpu());
            TensorView to(static_cast<char*>(staging_[s]) + o * int64_t(ed), dst.dtype, Shape{l}, Device::cpu());
            convert_copy_host(from, to);
        });
        DZR_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data) + off * int64_t(ed), staging_[s], size_t(len) * ed,
                                       cudaMemcpyHostToDevice, stream_));
        DZR_CUDA_CHECK(cudaEventRecord(staging_done_[s], stream_));
    }
}

void CudaStream::download(const TensorView& src, const TensorView& host_dst) {
    DZR_CHECK(src.device == device_.device() && (src.data != nullptr || src.numel() == 0),
              "cuda backend: download of {}: expected a tensor on {}", src.str(), device_.device().str());
    DZR_CHECK(host_dst.device.is_cpu(), "cuda backend: download needs a host destination, got {}", host_dst.str());
    DZR_CHECK(host_dst.is_contiguous(), "cuda backend: download needs a contiguous host_dst ({})", host_dst.str());
    DZR_CHECK(src.numel() == host_dst.numel(), "cuda backend: download of {} into {}: element counts differ",
              src.str(), host_dst.str());
    DZR_CHECK(!capturing(), "cuda backend: download of {} inside a graph capture (it synchronizes)", src.str());
    DeviceGuard guard(device_.index());
    Arena& arena = device_.workspace();
    ArenaScope scope(arena);
    TensorView from = src;
    if (!from.is_contiguous()) {
        // Strided device source: gather into a contiguous workspace buffer first.
        from = arena.alloc_view(src.shape, src.dtype);
        gather_(src, from);
    }
    const int64_t n = from.numel(), chunk = int64_t(kStagingBytes / dtype_size(from.dtype));
    const size_t es = dtype_size(from.dtype), ed = dtype_size(host_dst.dtype);
    for (int64_t off = 0; off < n; off += chunk) {
        const int64_t len = std::min(chunk, n - off);
        DZR_CUDA_CHECK(cudaMemcpyAsync(staging_[0], static_cast<const char*>(from.data) + off * int64_t(es),
                                       size_t(len) * es, cudaMemcpyDeviceToHost, stream_));
        DZR_CUDA_CHECK(cudaStreamSynchronize(stream_));
        TensorView staged(staging_[0], from.dtype, Shape{len}, Device::cpu());
        TensorView to(static_cast<char*>(host_dst.data) + off * int64_t(ed), host_dst.dtype, Shape{len}, Device::cpu());
        convert_copy_host(staged, to);
    }
    DZR_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaStream::synchronize() {
    DeviceGuard guard(device_.index());
    DZR_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::unique_ptr<Event> CudaStream::make_event() {
    DeviceGuard guard(device_.index());
    auto e = std::make_unique<CudaEvent>();
    DZR_CUDA_CHECK(cudaEventCreate(&e->ev));
    return e;
}

void CudaStream::record(Event& e) {
    DeviceGuard guard(device_.index());
    DZR_CUDA_CHECK(cudaEventRecord(cuda_event(e).ev, stream_));
}

void CudaStream::wait(const Event& e) {
    DeviceGuard guard(device_.index());
    DZR_CUDA_CHECK(cudaStreamWaitEvent(stream_, cuda_event(e).ev, 0));
}

double CudaStream::elapsed_ms(const Event& from, const Event& to) {
    DeviceGuard guard(device_.index());
    DZR_CUDA_CHECK(cudaEventSynchronize(cuda_event(to).ev));
    float ms = 0.0f;
    DZR_CUDA_CHECK(cudaEventElapsedTime(&ms, cuda_event(from).ev, cuda_event(to).ev));
    return double(ms);
}

void CudaStream::copy_pinned(const void* pinned_src, const TensorView& dst) {
    DZR_CHECK(dst.is_contiguous() && dst.device.is_cuda(), "copy_pinned: the destination must be contiguous on the "
              "device, got {}", dst.str());
    DeviceGuard guard(device_.index());
    DZR_CUDA_CHECK(cudaMemcpyAsync(dst.data, pinned_src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
}

namespace {

/// The copy stream (Backend::make_copy_stream): copies from pinned memory and events, nothing else.
class CudaCopyStream final : public Stream {
public:
    explicit CudaCopyStream(int index) : index_(index) {
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    }
    ~CudaCopyStream() override {
        int prev = 0;
        cudaGetDevice(&prev);
        cudaSetDevice(index_);
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
        cudaSetDevice(prev);
    }
    CudaCopyStream(const CudaCopyStream&) = delete;
    CudaCopyStream& operator=(const CudaCopyStream&) = delete;

    void upload(const TensorView&, const TensorView&) override { DZR_THROW("the copy stream only copies pinned memory"); }
    void download(const TensorView&, const TensorView&) override {
        DZR_THROW("the copy stream only copies pinned memory");
    }
    void synchronize() override {
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    std::unique_ptr<Event> make_event() override {
        DeviceGuard guard(index_);
        auto e = std::make_unique<CudaEvent>();
        DZR_CUDA_CHECK(cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming));
        return e;
    }
    void record(Event& e) override {
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaEventRecord(cuda_event(e).ev, stream_));
    }
    void wait(const Event& e) override {
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaStreamWaitEvent(stream_, cuda_event(e).ev, 0));
    }
    double elapsed_ms(const Event&, const Event&) override { DZR_THROW("the copy stream's events are not timed"); }
    void copy_pinned(const void* pinned_src, const TensorView& dst) override {
        DZR_CHECK(dst.is_contiguous() && dst.device.is_cuda(),
                  "copy_pinned: the destination must be contiguous on the device, got {}", dst.str());
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaMemcpyAsync(dst.data, pinned_src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    }

private:
    int index_ = 0;
    cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Stream> CudaBackend::make_copy_stream() { return std::make_unique<CudaCopyStream>(index_); }

void CudaStream::begin_capture() { cuda_detail::begin_capture(stream_, device_.index()); }

std::unique_ptr<Graph> CudaStream::end_capture() { return cuda_detail::end_capture(stream_, device_.index()); }

void CudaStream::abort_capture() { cuda_detail::abort_capture(stream_, device_.index()); }

bool CudaStream::capturing() const { return cuda_detail::is_capturing(stream_); }

// ---- backend -----------------------------------------------------------------------------------

CudaBackend::CudaBackend(int index, const BackendOptions& options)
    : Backend(options.numerics),
      index_(index),
      device_(index, options.cuda.pack_weights),
      arena_(device_.workspace()),
      queue_(device_, [this](const TensorView& src, const TensorView& dst) { copy(src, dst); }),
      stream_(queue_.handle()),
      options_(options.cuda) {
    DeviceGuard guard(index_);
    device_.set_stream(stream_);
    DZR_CUBLAS_CHECK(cublasLtCreate(&cublas_));
    DZR_CHECK(options_.lt_workspace_bytes <= kCublasWorkspaceBytes,
              "cuda backend: cuBLASLt workspace {} bytes exceeds the {} allocated", options_.lt_workspace_bytes,
              kCublasWorkspaceBytes);
    DZR_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
    device_.reserve_workspace(options.workspace_bytes == 0 ? kDefaultWorkspaceBytes : options.workspace_bytes);
    set_plain_gemm_impl(options_.plain_gemm);
    // NOTE: the FP8 GELU quantization looks its GELU up in a per-device table, filled here once (it waits)
    DZR_CUDA_CHECK(kernels::prepare_gelu_table(stream_));
}

CudaBackend::~CudaBackend() {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(index_);
    if (stream_) cudaStreamSynchronize(stream_);
    gemm_plans_.clear();
    conv_plans_.clear();
    sdpa_plans_.clear();  // NOTE: the plans hold cuDNN descriptors made with the handle destroyed below
    paged_sdpa_.reset();
    if (cudnn_) cudnnDestroy(cudnn_);
    if (cublas_) cublasLtDestroy(cublas_);
    if (blas_) cublasDestroy(blas_);
    if (cublas_workspace_) cudaFree(cublas_workspace_);
    cudaSetDevice(prev);
}

std::string CudaBackend::name() const {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, index_);
    return fmt::format("cuda:{} ({}, sm_{}{}, bf16, cuBLASLt + cuDNN {}, {} numerics)", index_, prop.name, prop.major,
                       prop.minor, cudnnGetVersion(), numerics_name(numerics()));
}

void CudaBackend::check_device_tensor(const TensorView& t, const char* op, const char* what) const {
    DZR_CHECK(t.device == device(), "cuda backend: {} got {} for {}, expected a tensor on {}", op, t.str(), what,
              device().str());
    DZR_CHECK(t.data != nullptr || t.numel() == 0, "cuda backend: {} got a null {} ({}); was it carved from a measuring arena?",
              op, what, t.str());
}

cudnnHandle_t CudaBackend::cudnn() {
    if (!cudnn_) {
        DZR_CUDNN_CHECK(cudnnCreate(&cudnn_));
        DZR_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    }
    return cudnn_;
}

void CudaBackend::do_copy(const TensorView& src, const TensorView& dst) {
    check_device_tensor(src, "copy", "src");
    check_device_tensor(dst, "copy", "dst");
    require_contiguous(dst, "copy", "dst");
    DZR_CHECK(src.numel() == dst.numel(), "cuda backend: copy of {} into {}: element counts differ", src.str(),
              dst.str());
    DZR_CHECK(kernels::convert_supported(src.dtype, dst.dtype),
              "cuda backend: copy cannot convert {} to {} (same dtype, or among f32, bf16, f16)", dtype_name(src.dtype),
              dtype_name(dst.dtype));
    DZR_CHECK(src.rank() <= kernels::kMaxCopyDims, "cuda backend: copy source {} has more than {} dims", src.str(),
              kernels::kMaxCopyDims);
    kernels::StridedLayout layout;
    layout.rank = src.rank();
    for (int d = 0; d < src.rank(); ++d) {
        layout.shape[d] = src.shape[d];
        layout.stride[d] = src.strides[d];
    }
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::convert_copy(src.data, src.dtype, layout, dst.data, dst.dtype, stream_));
}

void CudaBackend::do_fill(const TensorView& dst, float value) {
    check_device_tensor(dst, "fill", "dst");
    require_contiguous(dst, "fill", "dst");
    DZR_CHECK(kernels::fill_supported(dst.dtype), "cuda backend: fill does not support {}", dst.str());
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::fill(dst.data, dst.dtype, dst.numel(), value, stream_));
}

// ---- kernel-backed ops -------------------------------------------------------------------------

void CudaBackend::do_binary(const BinaryParams& p, const TensorView& a, const TensorView& b,
                            const TensorView& out) {
    for (const auto& [t, what] : {std::pair{&a, "a"}, std::pair{&b, "b"}, std::pair{&out, "out"}}) {
        check_device_tensor(*t, "binary", what);
        require_float(*t, "binary", what);
        require_contiguous(*t, "binary", what);
    }
    DZR_CHECK(out.numel() == a.numel(), "cuda backend: binary out {} vs a {}", out.str(), a.str());
    DZR_CHECK(broadcastable(a, b), "cuda backend: binary cannot broadcast {} onto {}", b.str(), a.str());
    const auto op = p.op == BinaryOp::Add   ? kernels::BinOp::Add
                    : p.op == BinaryOp::Sub ? kernels::BinOp::Sub
                    : p.op == BinaryOp::Mul ? kernels::BinOp::Mul
                                            : kernels::BinOp::Div;
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::binary(op, a.data, a.dtype, b.data, b.dtype, out.data, out.dtype, a.numel(), b.numel(),
                                   stream_));
}

namespace {

void unary_checks(const TensorView& x, const TensorView& out, const char* op) {
    require_float(x, op, "x");
    require_float(out, op, "out");
    require_contiguous(x, op, "x");
    require_contiguous(out, op, "out");
    DZR_CHECK(x.shape == out.shape, "cuda backend: {} shapes differ: x {} out {}", op, x.str(), out.str());
}

}  // namespace

void CudaBackend::do_scale(const ScaleParams& p, const TensorView& x, const TensorView& out) {
    check_device_tensor(x, "scale", "x");
    check_device_tensor(out, "scale", "out");
    unary_checks(x, out, "scale");
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::scale(x.data, x.dtype, out.data, out.dtype, x.numel(), p.alpha, p.beta, stream_));
}

void CudaBackend::do_activation(const ActivationParams& p, const TensorView& x, const TensorView& out) {
    check_device_tensor(x, "activation", "x");
    check_device_tensor(out, "activation", "out");
    unary_checks(x, out, "activation");
    kernels::ActKind kind = kernels::ActKind::Relu;
    switch (p.kind) {
        case Activation::GeluTanh:
            kind = kernels::ActKind::GeluTanh;
            break;
        case Activation::GeluErf:
            kind = kernels::ActKind::GeluErf;
            break;
        case Activation::Silu:
            kind = kernels::ActKind::Silu;
            break;
        case Activation::Relu:
            kind = kernels::ActKind::Relu;
            break;
        case Activation::Sigmoid:
            kind = kernels::ActKind::Sigmoid;
            break;
        case Activation::GeluTanhStepwise:
            kind = kernels::ActKind::GeluTanhStepwise;
            break;
    }
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::activation(kind, x.data, x.dtype, out.data, out.dtype, x.numel(), stream_));
}

void CudaBackend::do_layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight,
                                const TensorView& bias, const TensorView& out) {
    check_device_tensor(x, "layer_norm", "x");
    check_device_tensor(out, "layer_norm", "out");
    unary_checks(x, out, "layer_norm");
    const int64_t C = x.cols();
    check_param(weight, C, "layer_norm", "weight");
    check_param(bias, C, "layer_norm", "bias");
    if (weight.defined()) check_device_tensor(weight, "layer_norm", "weight");
    if (bias.defined()) check_device_tensor(bias, "layer_norm", "bias");
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::layer_norm(x.data, x.dtype, out.data, out.dtype, x.rows(), C, p.eps,
                                       weight.defined() ? weight.data : nullptr, weight.dtype,
                                       bias.defined() ? bias.data : nullptr, bias.dtype, stream_));
}

void CudaBackend::do_rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight,
                              const TensorView& out) {
    check_device_tensor(x, "rms_norm", "x");
    check_device_tensor(out, "rms_norm", "out");
    unary_checks(x, out, "rms_norm");
    const int64_t C = x.cols();
    check_param(weight, C, "rms_norm", "weight");
    if (weight.defined()) check_device_tensor(weight, "rms_norm", "weight");
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::rms_norm(x.data, x.dtype, out.data, out.dtype, x.rows(), C, p.eps,
                                     weight.defined() ? weight.data : nullptr, weight.dtype, stream_));
}

void CudaBackend::do_l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& weight,
                             const TensorView& out) {
    check_device_tensor(x, "l2_norm", "x");
    check_device_tensor(out, "l2_norm", "out");
    unary_checks(x, out, "l2_norm");
    const int64_t C = x.cols();
    DZR_CHECK(weight.defined(), "cuda backend: l2_norm needs a weight of {} channels", C);
    check_param(weight, C, "l2_norm", "weight");
    check_device_tensor(weight, "l2_norm", "weight");
    kernels::VaeNormArgs a;
    a.x = x.data, a.tx = x.dtype;
    a.out = out.data, a.to = out.dtype;
    a.weight = weight.data, a.tw = weight.dtype;
    a.rows = x.rows(), a.cols = C;
    a.eps = p.eps, a.scale = p.scale, a.silu = p.silu, a.eager = !autocast();
    a.fast = numerics() == Numerics::Fast;  // one rounding in either autocast state (Backend::autocast)
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::vae_norm(a, stream_));
}

void CudaBackend::do_resize_bicubic(const TensorView& src, const TensorView& dst) {
    check_device_tensor(src, "resize_bicubic", "src");
    check_device_tensor(dst, "resize_bicubic", "dst");
    DZR_CHECK(src.rank() == 3 && dst.rank() == 3 && src.dim(0) == dst.dim(0) && src.dtype == DType::F32 &&
                  dst.dtype == DType::F32 && src.is_contiguous() && dst.is_contiguous(),
              "cuda backend: resize_bicubic needs contiguous f32 [C, H, W] images of one C: {} -> {}", src.str(),
              dst.str());
    DZR_CHECK(src.dim(1) <= INT32_MAX && src.dim(2) <= INT32_MAX && dst.dim(1) <= INT32_MAX && dst.dim(2) <= INT32_MAX,
              "cuda backend: resize_bicubic image too large: {} -> {}", src.str(), dst.str());
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::resize_bicubic(static_cast<const float*>(src.data), static_cast<float*>(dst.data),
                                           src.dim(0), int(src.dim(1)), int(src.dim(2)), int(dst.dim(1)),
                                           int(dst.dim(2)), stream_));
}

void CudaBackend::do_sin_cos_table(float step, const TensorView& out) {
    check_device_tensor(out, "sin_cos_table", "out");
    require_float(out, "sin_cos_table", "out");
    DZR_CHECK(out.rank() == 2 && out.dim(1) % 2 == 0 && out.is_contiguous(),
              "cuda backend: sin_cos_table output must be a contiguous [T, 2·half], got {}", out.str());
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::sin_cos_table(step, out.dim(0), out.dim(1) / 2, out.data, out.dtype, stream_));
}

void CudaBackend::do_softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out) {
    check_device_tensor(x, "softmax", "x");
    check_device_tensor(out, "softmax", "out");
    unary_checks(x, out, "softmax");
    DZR_CHECK(x.data != out.data || x.dtype == out.dtype, "cuda backend: in-place softmax needs one dtype ({} vs {})",
              x.str(), out.str());
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::softmax(x.data, x.dtype, out.data, out.dtype, x.rows(), x.cols(), p.scale, stream_));
}

void CudaBackend::do_reduce(const ReduceParams& p, const TensorView& x, const TensorView& out) {
    check_device_tensor(x, "reduce", "x");
    check_device_tensor(out, "reduce", "out");
    require_float(x, "reduce", "x");
    require_float(out, "reduce", "out");
    require_contiguous(x, "reduce", "x");
    require_contiguous(out, "reduce", "out");
    DZR_CHECK(out.numel() == x.rows(), "cuda backend: reduce out {} needs {} elements", out.str(), x.rows());
    const auto kind = p.op == ReduceOp::Sum    ? kernels::ReduceKind::Sum
                      : p.op == ReduceOp::Mean ? kernels::ReduceKind::Mean
                                               : kernels::ReduceKind::Max;
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::reduce_rows(kind, x.data, x.dtype, out.data, out.dtype, x.rows(), x.cols(), stream_));
}

void CudaBackend::do_count_nonfinite(const TensorView& x, const TensorView& out) {
    check_device_tensor(x, "count_nonfinite", "x");
    check_device_tensor(out, "count_nonfinite", "out");
    require_float(x, "count_nonfinite", "x");
    require_contiguous(x, "count_nonfinite", "x");
    DZR_CHECK(out.dtype == DType::I32 && out.numel() == 1, "cuda backend: count_nonfinite needs an i32 [1] output, got {}",
              out.str());
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::count_nonfinite(x.data, x.dtype, x.numel(), static_cast<int32_t*>(out.data), stream_));
}

namespace {

/// A [G, C] per-group view (rows may be strided, columns contiguous) as the kernels take it; absent: {}.
kernels::GroupVec group_vec(const TensorView& v, int64_t C, int64_t min_groups, const char* op, const char* what) {
    if (!v.defined()) return {};
    DZR_CHECK(v.rank() == 2 && v.dim(1) == C && v.dim(0) >= min_groups && v.strides[1] == 1 &&
                  (v.dtype == DType::F32 || v.dtype == DType::BF16),
              "cuda backend: {} {} must be an f32/bf16 [>= {}, {}] view with contiguous rows, got {}", op, what,
              min_groups, C, v.str());
    return {v.data, v.dtype, v.strides[0]};
}

/// The groups of rows (FusedRowParams): two when the split falls inside a period's rows.
int64_t groups_of(const FusedRowParams& p, int64_t L) {
    DZR_CHECK(p.period > 0, "cuda backend: fused row op: period {} must be positive", p.period);
    return p.split < std::min(p.period, L) ? 2 : 1;
}

}  // namespace

void CudaBackend::do_ada_layer_norm(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                    const TensorView& bias, const TensorView& scale, const TensorView& shift,
                                    const TensorView& out) {
    check_device_tensor(x, "ada_layer_norm", "x");
    check_device_tensor(out, "ada_layer_norm", "out");
    unary_checks(x, out, "ada_layer_norm");
    const int64_t C = x.cols(), L = x.rows();
    check_param(weight, C, "ada_layer_norm", "weight");
    check_param(bias, C, "ada_layer_norm", "bias");
    DZR_CHECK(!weight.defined() || !bias.defined() || weight.dtype == bias.dtype,
              "cuda backend: ada_layer_norm weight and bias must share a dtype");
    const int64_t G = groups_of(p, L);
    const auto sc = group_vec(scale, C, G, "ada_layer_norm", "scale");
    const auto sh = group_vec(shift, C, G, "ada_layer_norm", "shift");
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::ada_layer_norm(x.data, x.dtype, out.data, out.dtype, L, C, p.eps,
                                           weight.defined() ? weight.data : nullptr,
                                           bias.defined() ? bias.data : nullptr,
                                           weight.defined() ? weight.dtype : bias.dtype, sc, sh, p.split, p.period,
                                           stream_, cuda_detail::row_impl(options_)));
}

void CudaBackend::do_ada_layer_norm_fp8(const FusedRowParams& p, const TensorView& x,
                                        const TensorView& weight, const TensorView& bias,
                                        const TensorView& scale, const TensorView& shift, const TensorView& q,
                                        const TensorView& scales) {
    const char* op = "ada_layer_norm_fp8";
    check_device_tensor(x, op, "x");
    check_device_tensor(q, op, "q");
    check_device_tensor(scales, op, "scales");
    const int64_t C = x.cols(), L = x.rows();
    DZR_CHECK(x.is_contiguous() && q.dtype == DType::F8_E4M3 && q.is_contiguous() && q.numel() == x.numel() &&
                  scales.dtype == DType::F32 && scales.is_contiguous() && scales.numel() == L,
              "cuda backend: {} needs a contiguous x, q f8_e4m3 of x's size and f32 scales of its rows: {} {} {}", op,
              x.str(), q.str(), scales.str());
    check_param(weight, C, op, "weight");
    check_param(bias, C, op, "bias");
    DZR_CHECK(!weight.defined() || !bias.defined() || weight.dtype == bias.dtype,
              "cuda backend: {} weight and bias must share a dtype", op);
    const int64_t G = groups_of(p, L);
    const auto sc = group_vec(scale, C, G, op, "scale");
    const auto sh = group_vec(shift, C, G, op, "shift");
    // NOTE: the fused kernel writes what quantize_fp8 makes of ada_layer_norm's bf16 rows; other shapes and dtypes
    // run the two ops
    if (x.dtype == DType::BF16 && compute_dtype() == DType::BF16) {
        DeviceGuard guard(index_);
        const cudaError_t e = kernels::ada_layer_norm_fp8(
            x.data, x.dtype, q.ptr<uint8_t>(), scales.ptr<float>(), L, C, p.eps,
            weight.defined() ? weight.data : nullptr, bias.defined() ? bias.data : nullptr,
            weight.defined() ? weight.dtype : bias.dtype, sc, sh, p.split, p.period, stream_,
            cuda_detail::row_impl(options_));
        if (e != cudaErrorNotSupported) {
            DZR_CUDA_CHECK(e);
            return;
        }
    }
    Backend::do_ada_layer_norm_fp8(p, x, weight, bias, scale, shift, q, scales);
}

void CudaBackend::do_gated_residual(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                    const TensorView& gate) {
    check_device_tensor(x, "gated_residual", "x");
    check_device_tensor(y, "gated_residual", "y");
    DZR_CHECK(x.is_contiguous() && y.is_contiguous() && x.shape == y.shape && x.dtype == y.dtype,
              "cuda backend: gated_residual needs contiguous x and y of one shape and dtype: {} {}", x.str(), y.str());
    const int64_t C = x.cols(), L = x.rows();
    const auto g = group_vec(gate, C, groups_of(p, L), "gated_residual", "gate");
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::gated_residual(x.data, y.data, x.dtype, L, C, g, p.split, p.period, stream_));
}

void CudaBackend::do_gated_residual_norm(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                         const TensorView& gate, const TensorView& weight,
                                         const TensorView& bias, const TensorView& scale,
                                         const TensorView& shift, const TensorView& out) {
    check_device_tensor(x, "gated_residual_norm", "x");
    check_device_tensor(y, "gated_residual_norm", "y");
    check_device_tensor(out, "gated_residual_norm", "out");
    DZR_CHECK(x.is_contiguous() && y.is_contiguous() && x.shape == y.shape && x.dtype == y.dtype,
              "cuda backend: gated_residual_norm needs contiguous x and y of one shape and dtype: {} {}", x.str(),
              y.str());
    unary_checks(x, out, "gated_residual_norm");
    const int64_t C = x.cols(), L = x.rows();
    check_param(weight, C, "gated_residual_norm", "weight");
    check_param(bias, C, "gated_residual_norm", "bias");
    DZR_CHECK(!weight.defined() || !bias.defined() || weight.dtype == bias.dtype,
              "cuda backend: gated_residual_norm weight and bias must share a dtype");
    const int64_t G = groups_of(p, L);
    kernels::GatedResidualNormArgs a;
    a.x = x.data, a.y = y.data, a.t = x.dtype;
    a.gate = group_vec(gate, C, G, "gated_residual_norm", "gate");
    a.out = out.data, a.to = out.dtype;
    a.rows = L, a.cols = C, a.eps = p.eps;
    a.weight = weight.defined() ? weight.data : nullptr;
    a.bias = bias.defined() ? bias.data : nullptr;
    a.tparam = weight.defined() ? weight.dtype : bias.dtype;
    a.scale = group_vec(scale, C, G, "gated_residual_norm", "scale");
    a.shift = group_vec(shift, C, G, "gated_residual_norm", "shift");
    a.split = p.split;
    a.period = p.period;
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::gated_residual_norm(a, stream_));
}

void CudaBackend::do_rms_norm_rope(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                   const TensorView& table_a, const TensorView& table_b,
                                   const TensorView& out) {
    check_device_tensor(x, "rms_norm_rope", "x");
    check_device_tensor(out, "rms_norm_rope", "out");
    DZR_CHECK(out.rank() == 3 && out.is_contiguous() && x.is_contiguous() && x.numel() == out.numel() &&
                  x.cols() == out.dim(1) * out.dim(2),
              "cuda backend: rms_norm_rope needs a contiguous x [L, H*D] and out [L, H, D]: {} {}", x.str(),
              out.str());
    const int64_t L = out.dim(0), H = out.dim(1), D = out.dim(2);
    check_param(weight, H * D, "rms_norm_rope", "weight");
    int64_t pairs = 0;
    int entry = 2;
    if (table_a.defined()) {
        DZR_CHECK(p.period > 0, "cuda backend: rms_norm_rope: period {} must be positive", p.period);
        const int64_t rows_per_period = std::min(p.period, L), s = std::min(p.split, rows_per_period);
        const auto check_table = [&](const TensorView& t, int64_t rows, const char* what) {
            DZR_CHECK(t.dtype == DType::F32 && t.is_contiguous() && t.rank() == 3 && t.dim(0) >= rows &&
                          (t.dim(2) == 2 || t.dim(2) == 4) && t.dim(1) * 2 <= D && t.dim(1) == table_a.dim(1) &&
                          t.dim(2) == table_a.dim(2),
                      "cuda backend: rms_norm_rope {} {} must be a contiguous f32 [>= {}, P <= {}, 2 or 4]", what,
                      t.str(), rows, D / 2);
        };
        check_table(table_a, s, "table_a");
        if (s < rows_per_period) {
            DZR_CHECK(table_b.defined(), "cuda backend: rms_norm_rope needs table_b for rows past the split");
            check_table(table_b, rows_per_period - s, "table_b");
        }
        pairs = table_a.dim(1);
        entry = int(table_a.dim(2));
    }
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::rms_norm_rope(
        x.data, x.dtype, out.data, out.dtype, L, H, D, p.eps, weight.defined() ? weight.data : nullptr, weight.dtype,
        table_a.defined() ? static_cast<const float*>(table_a.data) : nullptr,
        table_b.defined() ? static_cast<const float*>(table_b.data) : nullptr, pairs, entry, p.split, p.period,
        stream_, cuda_detail::row_impl(options_)));
}

void CudaBackend::do_rope(const RopeParams&, const TensorView& x, const TensorView& table,
                          const TensorView& out) {
    check_device_tensor(x, "rope", "x");
    check_device_tensor(out, "rope", "out");
    check_device_tensor(table, "rope", "table");
    require_float(x, "rope", "x");
    require_float(out, "rope", "out");
    DZR_CHECK(x.rank() == 3 && x.shape == out.shape, "cuda backend: rope needs x and out [L, H, D]: {} {}", x.str(),
              out.str());
    DZR_CHECK(x.strides[2] == 1 && out.strides[2] == 1, "cuda backend: rope needs unit head-dim strides: {} {}",
              x.str(), out.str());
    const int64_t L = x.dim(0), H = x.dim(1), D = x.dim(2);
    DZR_CHECK(D % 2 == 0, "cuda backend: rope needs an even head dim, got {}", x.str());
    DZR_CHECK(table.dtype == DType::F32 && table.is_contiguous() && table.rank() == 3 && table.dim(0) == L &&
                  (table.dim(2) == 2 || table.dim(2) == 4) && table.dim(1) * 2 <= D,
              "cuda backend: rope table {} must be a contiguous f32 [L={}, P<={}, 2 or 4]", table.str(), L, D / 2);
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::rope(x.data, x.dtype, x.strides[0], x.strides[1], out.data, out.dtype, out.strides[0],
                                 out.strides[1], L, H, D, static_cast<const float*>(table.data), table.dim(1),
                                 table.dim(2) == 4, stream_));
}

// ---- factory -----------------------------------------------------------------------------------

bool cuda_device_available() {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    cudaGetLastError();  // NOTE: a failed probe must not leave a sticky error behind
    return ok;
}

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    cudaGetLastError();  // NOTE: a failed probe must not leave a sticky error behind
    return n;
}

std::unique_ptr<Backend> make_cuda_backend(int index, const BackendOptions& options) {
    return std::make_unique<CudaBackend>(index, options);
}

}  // namespace dzr
