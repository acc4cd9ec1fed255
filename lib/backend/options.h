#pragma once
/// How a backend is made: its numerics mode, its workspace and (CUDA) which implementation runs each op family.
/// Typed options chosen when the backend is created (make_backend); the environment variables DZR_ATTENTION,
/// DZR_PLAIN_GEMM, DZR_CONV_API, DZR_LT_WORKSPACE and DZR_LT_ALIGN are kept only as documented overrides
/// (apply_env_overrides, docs/PERF.md, docs/PARITY.md).
/// Nothing here needs CUDA headers: the CLI and the configs parse these on every build.
#include <cstddef>
#include <cstdint>
#include <string>

namespace dzr {

/// The arithmetic a backend runs.
///  - Reference: the official PyTorch implementation's order, op for op (its eager bf16 rounding points, its
///    reduction orders, the library kernels PyTorch picks); bit-identical to the official bf16 run on CUDA. The
///    CPU backend's f32 arithmetic is its own reference.
///  - Fast: free to fuse and reorder (docs/PARITY.md gives its fidelity gate); starts equal to Reference.
enum class Numerics : uint8_t { Reference, Fast };
const char* numerics_name(Numerics n);
/// "reference" or "fast"; throws dzr::Error otherwise.
Numerics parse_numerics(const std::string& text);

/// Which implementation runs Backend::attention on CUDA (bf16/f16 without bias; f32 and biased attention always
/// take the GEMM path). Auto follows PyTorch's SDPA choice on the H200: above a head dim of 256 (where PyTorch's
/// cuDNN and flash backends refuse) dzr's kernel in the order of PyTorch's memory-efficient backend
/// (kernels/attention_memeff.cuh); otherwise cuDNN's unified SDPA node, then cuDNN's composite SDPA graph,
/// then dzr's flash kernel (head_dim 64/128), then the GEMM path. A forced choice throws when it cannot run
/// the call.
enum class AttentionImpl : uint8_t { Auto, CudnnUnified, CudnnComposite, Flash, MemEfficient, Gemm };
const char* attention_impl_name(AttentionImpl impl);
/// "auto", "cudnn-unified", "cudnn-composite", "flash", "mem-efficient", "gemm"; throws dzr::Error otherwise.
AttentionImpl parse_attention_impl(const std::string& text);

/// Which library runs the bf16 GEMMs that carry no bias (what PyTorch runs as torch.mm, a bias-free F.linear or
/// torch.bmm): cuBLASLt (as the GEMMs with a bias, PyTorch's addmm), or the cuBLAS calls PyTorch's default BLAS
/// backend makes for them (cublasGemmEx for one matrix, cublasGemmStridedBatchedEx for a batch). Measured
/// bit-identical to each other on every probe shape (docs/PARITY.md), so Lt is the default.
enum class PlainGemmImpl : uint8_t { Lt, Cublas };
/// "lt", "cublas"; throws dzr::Error otherwise.
PlainGemmImpl parse_plain_gemm_impl(const std::string& text);

/// Which operand alignments dzr tells cuBLASLt's heuristic (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*): Dzr = each base
/// pointer's and its row (and batch) stride's, D the same as C; Torch = the base pointers' only, and D the bias
/// pointer's when the bias is in the epilogue (else cuBLASLt's default, 256), as PyTorch's gemm_and_bias and
/// gemm_internal_cublaslt pass them. The heuristic only returns algorithms that need no more than these.
enum class LtAlignment : uint8_t { Dzr, Torch };
/// "dzr", "torch"; throws dzr::Error otherwise.
LtAlignment parse_lt_alignment(const std::string& text);

/// The workspace the cuBLASLt GEMMs may use (the heuristic plans for it: a larger one admits more split-K
/// algorithms at a large K and a small N), at most kMaxLtWorkspaceBytes (the buffer the CUDA backend allocates).
inline constexpr size_t kMaxLtWorkspaceBytes = size_t(32) << 20;

/// How Backend::paged_attention runs on CUDA (bf16/f16 pools; an FP8 pool always gathers): Direct = the flash
/// kernel reads the history through the device block table; Gather = one kernel copies [history | current] into
/// the workspace, then the dense attention; CudnnPaged = cuDNN SDPA reads the history through the block table and
/// a dense cuDNN SDPA the current rows, the two merged by their log-sum-exps (no copy of the rows; throws where
/// cuDNN refuses the graphs; measured slower than Gather where cuDNN 9.14 runs it, so only when forced). Auto =
/// Gather when cuDNN SDPA takes the dense call, else Direct (fast numerics with no history: the dense attention over
/// the current rows where they lie; reference numerics keep the gathered call, the one PyTorch's SDPA makes).
enum class PagedAttentionImpl : uint8_t { Auto, Direct, Gather, CudnnPaged };

/// Which cuDNN API plans convolutions: Graph (the graph API with PyTorch's engine choice: heuristics INSTANT,
/// then fallback, no down-converting engines) or Legacy (the v7 heuristics; a diagnostic).
enum class ConvApi : uint8_t { Graph, Legacy };

/// How fast numerics run convolutions on CUDA (cuda_conv_fast.cpp). Auto: each call shape runs channels-last through
/// the cuDNN engine config measured fastest on its first call, or the reference path where that measured faster.
/// The choice is made by timing, so it can differ between processes (and with it the last bits of a fast run).
/// ChannelsLast: the fastest channels-last config even where the reference path is faster (tests, benches). Off:
/// the reference path. Reference numerics always run the reference path.
enum class ConvTune : uint8_t { Off, Auto, ChannelsLast };
/// "off", "auto", "channels-last"; throws dzr::Error otherwise.
ConvTune parse_conv_tune(const std::string& text);
/// The kernels fast numerics' fused row ops take on bf16 rows (kernels/dit_fused.cuh RowImpl): Stream (persistent
/// blocks, the next rows' loads in flight, the parameters staged once per block; the GELU quantization by table) or
/// Warp (the one-warp-per-row kernels and the evaluating GELU quantization, kept for `dzr bench fused`'s comparison), or
/// Stream8 (the streamed kernels' earlier shape: 8 warps a block, f32-staged vectors; Stream's bits, for comparisons).
/// All write values within fast numerics' bounds; each FP8 fused op writes the codes of its own bf16 op.
enum class RowKernels : uint8_t { Stream, Warp, Stream8 };
/// "stream", "warp", "stream8"; throws dzr::Error otherwise.
RowKernels parse_row_kernels(const std::string& text);
/// A switch's value: 1, true or on; 0, false or off (the DZR_* on/off variables); anything else throws.
bool parse_switch(const std::string& text);
/// An environment switch that can only turn a setting off: `value` (the variable `name`'s, null or empty: unset)
/// off -> false, on or unset -> `configured`; anything else throws naming "name=value".
bool env_switch_off(const char* name, bool configured, const char* value);
/// The CUDA backend's implementation choices. The CPU backend has one implementation of each op.
struct CudaBackendOptions {
    AttentionImpl attention = AttentionImpl::Auto;
    PagedAttentionImpl paged_attention = PagedAttentionImpl::Auto;
    /// NOTE: bias-free GEMMs through cuBLAS (cublasGemmEx) as torch.mm/bmm run them: at the real widths the action
    /// decoder's bmm (M 24, K 5120) is split along K differently by cuBLASLt (docs/PARITY.md, the real widths)
    PlainGemmImpl plain_gemm = PlainGemmImpl::Cublas;
    ConvApi conv_api = ConvApi::Graph;
    /// Workspace bytes the cuBLASLt GEMMs may use (at most kMaxLtWorkspaceBytes = 32 MiB, the buffer allocated).
    /// NOTE: 1 MiB, PyTorch 2.11's cuBLASLt default (CUBLASLT_WORKSPACE_SIZE = 1024 KiB): the heuristic's pick
    /// depends on it; at the real widths the DiT head (N 64, K 5120) is split along K differently with 32 MiB and
    /// its bits differ (measured on the H200, docs/PARITY.md)
    size_t lt_workspace_bytes = size_t(1) << 20;
    LtAlignment lt_alignment = LtAlignment::Dzr;
    /// GEMMs and convolutions through dzr's plain kernels instead of cuBLASLt / cuDNN (tests of the fallback
    /// paths that odd shapes take).
    bool fallback_only = false;
    ConvTune conv_tune = ConvTune::Auto;
    /// FP8 GEMMs with cuBLASLt's fast accumulation (no periodic promotion of the tensor cores' partial sums to f32):
    /// faster, less exact. Off by default.
    bool fp8_fast_accum = false;
    RowKernels row_kernels = RowKernels::Stream;
    /// Fast numerics: the batched CFG branches' self-attention as one cuDNN SDPA of batch B
    /// (Backend::paged_attention_batched); false runs one SDPA per branch.
    bool batched_attention = true;
    /// Fast numerics: large bf16 cuBLASLt GEMMs (>= 20 GFLOP) time the heuristic's first candidates once, when their
    /// plan is made (the warm-up's eager forwards), and keep the fastest if it beats the first by 2% (the heuristic's
    /// pick at the commit forward's 3520 rows ran 4.7% slower than its second: docs/PERF.md, "GEMM (cuBLASLt)").
    /// Reference numerics never tune; FP8 GEMMs keep the heuristic's pick (timing them measured no gain).
    bool gemm_tune = true;
    /// The weights of a device in one slab (one cudaMalloc); false gives every tensor its own allocation (a
    /// comparison, or a driver that misbehaves). The same bits either way.
    bool pack_weights = true;
};

struct BackendOptions {
    Numerics numerics = Numerics::Reference;
    /// Initial workspace arena; 0 = the backend's default (the policy plans and reserves its own).
    size_t workspace_bytes = 0;
    CudaBackendOptions cuda;
    /// make_backend attaches a Profiler to the backend (Backend::attach_profiler, profiler.h): every op timed with
    /// events, regions, CUPTI kernel counts where built in. For finding where time goes; it slows every op down.
    bool profile = false;
    /// With `profile`: time every op with events (true), or leave the ops untimed (false) so that the DiT's forwards
    /// still replay their CUDA graphs; the profile then holds each region's CUPTI kernel counts, host launches and
    /// idle gaps only: what a replayed call launches (`--profile-graphs`).
    bool profile_ops = true;
};

/// `o` with the documented environment overrides applied: DZR_ATTENTION (an AttentionImpl name),
/// DZR_PLAIN_GEMM (lt | cublas), DZR_CONV_API (graph | legacy), DZR_LT_WORKSPACE (KiB, 0..32768, as PyTorch's
/// CUBLASLT_WORKSPACE_SIZE), DZR_LT_ALIGN (dzr | torch), DZR_CONV_TUNE (auto | off | channels-last), DZR_ROW_KERNELS
/// (stream | stream8 | warp), DZR_BATCHED_ATTENTION and DZR_GEMM_TUNE (switches: parse_switch). An unreadable value throws,
/// naming the variable.
BackendOptions apply_env_overrides(BackendOptions o);

}  // namespace dzr
