// `dzr parity attention|linear|conv3d|bmm|op` (parity_kernels.h). Every operand is read and checked first (in
// any build: a bad file gets its error before a device is needed), then the op runs on the CUDA backend.
#include "apps/dzr/diag/parity_kernels.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "io/npy.h"

namespace dzr::app {
namespace {

namespace fs = std::filesystem;

/// The environment overrides (DZR_ATTENTION, DZR_PLAIN_GEMM, DZR_CONV_API) on top of `o`: the probes compare the
/// implementations they pick against PyTorch (scripts/parity/kernel_probe.py sets them).
BackendOptions with_env(BackendOptions o) { return apply_env_overrides(o); }

std::unique_ptr<Backend> probe_backend(const std::string& device, size_t workspace_bytes) {
    BackendOptions o;
    o.workspace_bytes = workspace_bytes;
    return make_cuda_backend(parse_device(device).index, with_env(o));
}

struct AttentionArgs {
    std::string q, k, v;
    std::string out;
    std::string device = "cuda";
    float scale = 0.f;  // 0: 1/sqrt(head dim)
    std::vector<std::string> impls = {"cudnn-unified", "cudnn-composite", "flash", "mem-efficient", "gemm"};
};

struct LinearArgs {
    std::string x, w, b;
    std::string out;
    std::string device = "cuda";
};

struct Conv3dArgs {
    std::string x, w, b;
    std::string out;
    std::string device = "cuda";
    std::vector<int> stride = {1, 1, 1}, pad_before = {0, 0, 0}, pad_after = {0, 0, 0};
    bool frames_2d = false;
    bool channels_last = false;
};

struct BmmArgs {
    std::string a, b;
    bool b_transposed = false;
    std::string out;
    std::string device = "cuda";
    std::string impl = "lt";
};

struct OpArgs {
    std::string op;
    std::string x, w, b;
    std::string out;
    std::string device = "cuda";
    float eps = 1e-6f;
};

/// An operand holding bf16 values as float32 of the given rank; anything else would be rounded silently, so
/// it is an error naming the file and the element.
io::NpyArray read_bf16_values(const std::string& path, const char* what, int rank, const char* layout) {
    io::NpyArray a = io::read_npy(path);
    DZR_CHECK(a.dtype() == io::NpyDType::F4 && a.rank() == rank, "{}: {} must be float32 {}, got {}", path,
              what, layout, a.describe());
    const float* p = a.ptr<float>();
    for (int64_t i = 0; i < a.numel(); ++i) {
        uint32_t bits = 0;
        std::memcpy(&bits, &p[i], 4);
        DZR_CHECK(
            (bits & 0xffffu) == 0 && std::isfinite(p[i]),
            "{}: element {} ({}) is not a finite bf16 value; write the bf16 tensor converted to float32",
            path, i, p[i]);
    }
    return a;
}

std::optional<io::NpyArray> read_optional(const std::string& path, const char* what, int rank,
                                          const char* layout) {
    if (path.empty()) return std::nullopt;
    return read_bf16_values(path, what, rank, layout);
}

Tensor upload_bf16(Backend& be, const io::NpyArray& host) {
    Tensor t = be.alloc(Shape(host.shape()), DType::BF16);
    be.upload(host.to_tensor(), t);
    return t;
}

/// Downloads `out` as float32 and writes it to `path`.
void write_output(Backend& be, const Tensor& out, const fs::path& path) {
    Tensor host = Tensor::host(out.shape(), DType::F32);
    be.download(out, host);
    if (path.has_parent_path()) fs::create_directories(path.parent_path());
    io::write_npy(path, host.view());
}

int run_attention(const AttentionArgs& a) {
    const io::NpyArray qa = read_bf16_values(a.q, "q", 3, "[L, heads, head_dim]"),
                       ka = read_bf16_values(a.k, "k", 3, "[L, heads, head_dim]"),
                       va = read_bf16_values(a.v, "v", 3, "[L, heads, head_dim]");
    const int64_t lq = qa.dim(0), heads = qa.dim(1), d = qa.dim(2), lk = ka.dim(0), dv = va.dim(2);
    DZR_CHECK(ka.dim(1) == heads && va.dim(1) == heads && ka.dim(2) == d && va.dim(0) == lk,
              "attention: shapes disagree: q {} k {} v {}", qa.shape_str(), ka.shape_str(), va.shape_str());
    std::vector<AttentionImpl> impls;
    for (const std::string& name : a.impls) impls.push_back(parse_attention_impl(name));
    auto owned = probe_backend(a.device, size_t(1) << 30);
    Backend* be = owned.get();
    const Tensor q = upload_bf16(*be, qa), k = upload_bf16(*be, ka), v = upload_bf16(*be, va);
    Tensor out = be->alloc({lq, heads, dv}, DType::BF16);
    // the default as PyTorch's SDPA computes it: 1 / sqrt(d) in double, then rounded to float
    const float scale = a.scale > 0 ? a.scale : float(1.0 / std::sqrt(double(d)));
    std::printf("attention on %s: q [%lld, %lld, %lld], k/v [%lld, ...], scale %.9g\n", be->name().c_str(),
                (long long)lq, (long long)heads, (long long)d, (long long)lk, double(scale));
    for (const AttentionImpl impl : impls) {
        CudaBackendOptions co = be->cuda_options();
        co.attention = impl;
        be->set_cuda_options(co);
        be->fill(out, 0.f);
        try {
            be->attention({scale}, q, k, v, {}, out);
        } catch (const Error& e) {  // an implementation that cannot run this shape: say so, run the others
            std::printf("  %-16s refused: %s\n", attention_impl_name(impl), e.what());
            continue;
        }
        const fs::path file = fs::path(a.out) / fmt::format("o_{}.npy", attention_impl_name(impl));
        write_output(*be, out, file);
        std::printf("  %-16s ran %-16s -> %s\n", attention_impl_name(impl), be->last_attention_impl().c_str(),
                    file.string().c_str());
    }
    return 0;
}

int run_linear(const LinearArgs& a) {
    const io::NpyArray xa = read_bf16_values(a.x, "x", 2, "[M, K]"),
                       wa = read_bf16_values(a.w, "w", 2, "[N, K]");
    const std::optional<io::NpyArray> ba = read_optional(a.b, "b", 1, "[N]");
    const int64_t M = xa.dim(0), K = xa.dim(1), N = wa.dim(0);
    DZR_CHECK(wa.dim(1) == K && (!ba || ba->dim(0) == N), "linear: shapes disagree: x {} w {} b {}",
              xa.shape_str(), wa.shape_str(), ba ? ba->shape_str() : "-");
    auto be = probe_backend(a.device, size_t(256) << 20);
    const Tensor x = upload_bf16(*be, xa), w = upload_bf16(*be, wa);
    Tensor b;
    if (ba) b = upload_bf16(*be, *ba);
    Tensor out = be->alloc({M, N}, DType::BF16);
    be->linear(x, w, ba ? b.view() : TensorView{}, out);
    write_output(*be, out, a.out);
    std::printf("linear on %s: [%lld, %lld] x [%lld, %lld]^T%s -> %s\n", be->name().c_str(), (long long)M,
                (long long)K, (long long)N, (long long)K, ba ? " + b" : "", a.out.c_str());
    return 0;
}

int run_conv3d(const Conv3dArgs& a) {
    const io::NpyArray xa = read_bf16_values(a.x, "x", 4, "[Ci, T, H, W]"),
                       wa = read_bf16_values(a.w, "w", 5, "[Co, Ci, kt, kh, kw]");
    const std::optional<io::NpyArray> ba = read_optional(a.b, "b", 1, "[Co]");
    DZR_CHECK(a.stride.size() == 3 && a.pad_before.size() == 3 && a.pad_after.size() == 3,
              "conv3d: --stride, --pad-before and --pad-after take 3 values each");
    DZR_CHECK(wa.dim(1) == xa.dim(0) && (!ba || ba->dim(0) == wa.dim(0)),
              "conv3d: shapes disagree: x {} w {} b {}", xa.shape_str(), wa.shape_str(),
              ba ? ba->shape_str() : "-");
    Conv3dParams p;
    p.frames_2d = a.frames_2d;
    DZR_CHECK(!a.channels_last || a.frames_2d, "conv3d: --channels-last needs --frames-2d");
    p.channels_last = a.channels_last;
    int64_t o[3];
    for (int i = 0; i < 3; ++i) {
        p.stride[i] = a.stride[size_t(i)], p.pad_before[i] = a.pad_before[size_t(i)];
        p.pad_after[i] = a.pad_after[size_t(i)];
        DZR_CHECK(p.stride[i] >= 1 && p.pad_before[i] >= 0 && p.pad_after[i] >= 0,
                  "conv3d: strides must be >= 1 and paddings >= 0");
        o[i] = (xa.dim(i + 1) + p.pad_before[i] + p.pad_after[i] - wa.dim(i + 2)) / p.stride[i] + 1;
        DZR_CHECK(o[i] >= 1, "conv3d: the kernel {} does not fit the padded input {}", wa.shape_str(),
                  xa.shape_str());
    }
    auto be = probe_backend(a.device, size_t(1) << 30);
    const Tensor x = upload_bf16(*be, xa), w = upload_bf16(*be, wa);
    Tensor b;
    if (ba) b = upload_bf16(*be, *ba);
    const int64_t Co = wa.dim(0);
    Tensor out = be->alloc({Co, o[0], o[1], o[2]}, DType::BF16);
    be->conv3d(p, x, w, ba ? b.view() : TensorView{}, out);
    write_output(*be, out, a.out);
    std::printf("conv3d%s on %s: x %s w %s -> [%lld, %lld, %lld, %lld] %s\n",
                a.frames_2d ? " (2-D frames)" : "", be->name().c_str(), xa.shape_str().c_str(),
                wa.shape_str().c_str(), (long long)Co, (long long)o[0], (long long)o[1], (long long)o[2],
                a.out.c_str());
    return 0;
}

int run_bmm(const BmmArgs& a) {
    const io::NpyArray aa = read_bf16_values(a.a, "a", 3, "[batch, M, K]"),
                       ba = read_bf16_values(a.b, "b", 3, a.b_transposed ? "[batch, N, K]" : "[batch, K, N]");
    const int64_t B = aa.dim(0), M = aa.dim(1), K = aa.dim(2), N = a.b_transposed ? ba.dim(1) : ba.dim(2);
    DZR_CHECK(ba.dim(0) == B && (a.b_transposed ? ba.dim(2) : ba.dim(1)) == K,
              "bmm: shapes disagree: a {} b {}{}", aa.shape_str(), ba.shape_str(),
              a.b_transposed ? " (transposed)" : "");
    DZR_CHECK(a.impl == "lt" || a.impl == "cublas", "bmm: --impl must be lt or cublas, got '{}'", a.impl);
    BackendOptions bo = with_env({});
    bo.workspace_bytes = size_t(256) << 20;
    bo.cuda.plain_gemm = parse_plain_gemm_impl(a.impl);  // --impl over DZR_PLAIN_GEMM
    auto owned = make_cuda_backend(parse_device(a.device).index, bo);
    Backend* be = owned.get();
    const Tensor x = upload_bf16(*be, aa), y = upload_bf16(*be, ba);
    Tensor out = be->alloc({B, M, N}, DType::BF16);
    GemmParams p;
    p.trans_b = a.b_transposed;
    be->gemm(p, x, y, {}, out);
    write_output(*be, out, a.out);
    std::printf("bmm (%s) on %s: a %s b %s%s -> %s\n", a.impl.c_str(), be->name().c_str(),
                aa.shape_str().c_str(), ba.shape_str().c_str(), a.b_transposed ? "^T" : "", a.out.c_str());
    return 0;
}

constexpr const char* kOps = "layer_norm, rms_norm, gelu_tanh, gelu_erf, gelu_t5, silu, sigmoid, softmax";

int run_op(const OpArgs& a) {
    const bool norm = a.op == "layer_norm" || a.op == "rms_norm";
    const bool known = norm || a.op == "gelu_tanh" || a.op == "gelu_erf" || a.op == "gelu_t5" || a.op == "silu" ||
                       a.op == "sigmoid" || a.op == "softmax";
    DZR_CHECK(known, "op: unknown op '{}' ({})", a.op, kOps);
    DZR_CHECK(norm || (a.w.empty() && a.b.empty()), "op: {} takes no --w or --b", a.op);
    DZR_CHECK(a.op != "rms_norm" || a.b.empty(), "op: rms_norm takes no --b");
    const io::NpyArray xa = read_bf16_values(a.x, "x", 2, "[rows, cols]");
    const int64_t cols = xa.dim(1);
    const std::optional<io::NpyArray> wa = read_optional(a.w, "w", 1, "[cols]"),
                                      ba = read_optional(a.b, "b", 1, "[cols]");
    for (const auto* p : {&wa, &ba})
        DZR_CHECK(!*p || (*p)->dim(0) == cols, "op: weight/bias {} do not match {} columns",
                  (*p)->shape_str(), cols);
    auto be = probe_backend(a.device, size_t(256) << 20);
    const Tensor x = upload_bf16(*be, xa);
    Tensor w, b;
    if (wa) w = upload_bf16(*be, *wa);
    if (ba) b = upload_bf16(*be, *ba);
    const TensorView wv = wa ? w.view() : TensorView{}, bv = ba ? b.view() : TensorView{};
    Tensor out = be->alloc(Shape(xa.shape()), DType::BF16);
    if (a.op == "layer_norm")
        be->layer_norm({a.eps}, x, wv, bv, out);
    else if (a.op == "rms_norm")
        be->rms_norm({a.eps}, x, wv, out);
    else if (a.op == "gelu_tanh")
        be->activation({Activation::GeluTanh}, x, out);
    else if (a.op == "gelu_erf")
        be->activation({Activation::GeluErf}, x, out);
    else if (a.op == "gelu_t5")  // umT5's own GELU module, op by op
        be->activation({Activation::GeluTanhStepwise}, x, out);
    else if (a.op == "sigmoid")
        be->activation({Activation::Sigmoid}, x, out);
    else if (a.op == "softmax")  // over the last dim, f32 statistics, as F.softmax(x.float(), -1) then bf16
        be->softmax({1.0f}, x, out);
    else
        be->activation({Activation::Silu}, x, out);
    write_output(*be, out, a.out);
    std::printf("%s on %s: %s -> %s\n", a.op.c_str(), be->name().c_str(), xa.shape_str().c_str(),
                a.out.c_str());
    return 0;
}

}  // namespace

void add_parity_kernel_commands(CLI::App& parity, std::function<int()>& run) {
    CLI::App* cmd = &parity;
    auto at = std::make_shared<AttentionArgs>();
    auto* t = cmd->add_subcommand(
        "attention", "Run one bf16 attention from .npy operands through each CUDA implementation");
    t->add_option("--q", at->q, "float32 [Lq, heads, head_dim] holding bf16 values")->required();
    t->add_option("--k", at->k, "float32 [Lk, heads, head_dim] holding bf16 values")->required();
    t->add_option("--v", at->v, "float32 [Lk, heads, head_dim_v] holding bf16 values")->required();
    t->add_option("--out", at->out, "Directory for o_<implementation>.npy (float32 [Lq, heads, head_dim_v])")
        ->required();
    t->add_option("--scale", at->scale, "Softmax scale (default 1/sqrt(head_dim))");
    t->add_option("--impls", at->impls, "Implementations to run")->capture_default_str();
    t->add_option("--device", at->device, "CUDA device")->capture_default_str();
    t->callback([&run, at] { run = [at] { return run_attention(*at); }; });

    auto li = std::make_shared<LinearArgs>();
    auto* l = cmd->add_subcommand("linear", "Run one bf16 Linear (x w^T + b) from .npy operands on CUDA");
    l->add_option("--x", li->x, "float32 [M, K] holding bf16 values")->required();
    l->add_option("--w", li->w, "float32 [N, K] holding bf16 values")->required();
    l->add_option("--b", li->b, "float32 [N] holding bf16 values (optional)");
    l->add_option("--out", li->out, "Output .npy (float32 [M, N])")->required();
    l->add_option("--device", li->device, "CUDA device")->capture_default_str();
    l->callback([&run, li] { run = [li] { return run_linear(*li); }; });

    auto cv = std::make_shared<Conv3dArgs>();
    auto* c =
        cmd->add_subcommand("conv3d", "Run one bf16 conv3d (the backend's op) from .npy operands on CUDA");
    c->add_option("--x", cv->x, "float32 [Ci, T, H, W] holding bf16 values")->required();
    c->add_option("--w", cv->w, "float32 [Co, Ci, kt, kh, kw] holding bf16 values")->required();
    c->add_option("--b", cv->b, "float32 [Co] holding bf16 values (optional)");
    c->add_option("--out", cv->out, "Output .npy (float32 [Co, To, Ho, Wo])")->required();
    c->add_option("--stride", cv->stride, "t h w")->expected(3)->capture_default_str();
    c->add_option("--pad-before", cv->pad_before, "t h w")->expected(3)->capture_default_str();
    c->add_option("--pad-after", cv->pad_after, "t h w")->expected(3)->capture_default_str();
    c->add_flag("--frames-2d", cv->frames_2d, "Run as a Conv2d over the frames (Conv3dParams::frames_2d)");
    c->add_flag("--channels-last", cv->channels_last,
                "With --frames-2d: on channels-last frames (Conv3dParams::channels_last)");
    c->add_option("--device", cv->device, "CUDA device")->capture_default_str();
    c->callback([&run, cv] { run = [cv] { return run_conv3d(*cv); }; });

    auto bm = std::make_shared<BmmArgs>();
    auto* m =
        cmd->add_subcommand("bmm", "Run one bf16 batched GEMM (torch.bmm: a @ b) from .npy operands on CUDA");
    m->add_option("--a", bm->a, "float32 [batch, M, K] holding bf16 values")->required();
    m->add_option("--b", bm->b,
                  "float32 [batch, K, N] (or [batch, N, K] with --b-transposed) holding bf16 values")
        ->required();
    m->add_flag("--b-transposed", bm->b_transposed, "b is stored [batch, N, K] and used transposed");
    m->add_option("--impl", bm->impl,
                  "lt (cuBLASLt) or cublas (cublasGemmEx for one batch, cublasGemmStridedBatchedEx otherwise)")
        ->capture_default_str();
    m->add_option("--out", bm->out, "Output .npy (float32 [batch, M, N])")->required();
    m->add_option("--device", bm->device, "CUDA device")->capture_default_str();
    m->callback([&run, bm] { run = [bm] { return run_bmm(*bm); }; });

    auto oa = std::make_shared<OpArgs>();
    auto* o =
        cmd->add_subcommand("op", "Run one bf16 row op (norm or activation) from .npy operands on CUDA");
    o->add_option("--op", oa->op, kOps)->required();
    o->add_option("--x", oa->x, "float32 [rows, cols] holding bf16 values")->required();
    o->add_option("--w", oa->w, "norm weight, float32 [cols] holding bf16 values");
    o->add_option("--b", oa->b, "LayerNorm bias, float32 [cols] holding bf16 values");
    o->add_option("--eps", oa->eps, "norm epsilon")->capture_default_str();
    o->add_option("--out", oa->out, "Output .npy (float32 [rows, cols])")->required();
    o->add_option("--device", oa->device, "CUDA device")->capture_default_str();
    o->callback([&run, oa] { run = [oa] { return run_op(*oa); }; });
}

}  // namespace dzr::app
