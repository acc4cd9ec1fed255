// CPU 3-D convolution (f32), two paths:
//  - direct: the input of a band of output rows is packed once into a zero-padded, stride-phase-split
//    slab, then register tiles of 4 output channels x 16 (or 8) output columns accumulate every tap
//    with vector loads along the width, in the order bias, ci, kt, kh, kw. Suits the VAE's few-channel
//    convs (tiny configs), where an im2col GEMM has M = Co of 4..32 and spends its time building the
//    column matrix.
//  - im2col + sgemm per output frame and band of rows, added to the bias, for wide convs where OpenBLAS
//    is efficient.
// NOTE: in both, an output element's summation order depends on the conv's shape only, never on its
// position or on how many frames a call carries: chunked and whole-clip VAE passes agree bit for bit.
// Temporal taps that fall on the zero padding are skipped (adding +0 would not change a sum). The
// direct kernels are compiled for AVX2+FMA (chosen at run time when the CPU has it) and for the
// baseline ISA; results differ between the two by rounding only.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"

namespace dzr::cpu {
namespace {

struct Geometry {
    int64_t Ci = 0, T = 0, H = 0, W = 0;
    int64_t Co = 0, kt = 0, kh = 0, kw = 0;
    int64_t To = 0, Ho = 0, Wo = 0;
    int64_t st = 1, sh = 1, sw = 1;  // strides
    int64_t pt = 0, ph = 0, pw = 0;  // padding before (after-padding only shows as output extent)
};

constexpr int64_t kCoBlock = 4;                      // output channels per register tile
constexpr int64_t kSlabBytes = int64_t(192) << 10;   // packed input per band (L2-resident)
constexpr int64_t kColumnBytes = int64_t(16) << 20;  // im2col matrix per band

// ---- direct path --------------------------------------------------------------------------------

typedef float V4 __attribute__((vector_size(16)));
typedef float V8 __attribute__((vector_size(32)));

/// A band of output rows of one output frame, with its packed input.
struct Band {
    const float* slab = nullptr;  // [Ci][A][Hb][sw][Wq]
    int64_t A = 0;                // valid temporal taps a_lo .. a_lo + A - 1
    int64_t a_lo = 0;
    int64_t Hb = 0, Wq = 0;       // packed rows per (ci, a); columns per phase
    int64_t oh0 = 0, rows = 0;    // output rows [oh0, oh0 + rows)
    int64_t ot = 0;
};

/// One tile: output channels [cb * 4, cb * 4 + 4) x columns [ow0, ow0 + NV * lanes) of output row
/// oh0 + r. `wp` holds the packed weights of the channel block [Ci][kt][kh][kw][4].
template <typename V, int NV>
inline __attribute__((always_inline)) void tile(const Geometry& g, const Band& band, const float* wp,
                                                const float* bias4, const int64_t* col_off, int64_t r,
                                                int64_t ow0, float* const* out_rows, int64_t valid_co) {
    constexpr int kLanes = int(sizeof(V) / sizeof(float));
    V acc[kCoBlock][NV];
    for (int k = 0; k < kCoBlock; ++k)
        for (int j = 0; j < NV; ++j) acc[k][j] = V{} + bias4[k];
    const int64_t row_len = g.sw * band.Wq;
    for (int64_t ci = 0; ci < g.Ci; ++ci)
        for (int64_t ai = 0; ai < band.A; ++ai) {
            const float* plane = band.slab + ((ci * band.A + ai) * band.Hb + r * g.sh) * row_len + ow0;
            const float* wa = wp + ((ci * g.kt + band.a_lo + ai) * g.kh) * g.kw * kCoBlock;
            for (int64_t b = 0; b < g.kh; ++b) {
                const float* row = plane + b * row_len;
                const float* wb = wa + b * g.kw * kCoBlock;
                for (int64_t c = 0; c < g.kw; ++c) {
                    const float* xr = row + col_off[c];
                    V xv[NV];
                    for (int j = 0; j < NV; ++j) std::memcpy(&xv[j], xr + j * kLanes, sizeof(V));
                    const float* wc = wb + c * kCoBlock;
                    for (int k = 0; k < kCoBlock; ++k) {
                        const float wk = wc[k];
                        for (int j = 0; j < NV; ++j) acc[k][j] += xv[j] * wk;
                    }
                }
            }
        }
    const int64_t n = std::min<int64_t>(NV * kLanes, g.Wo - ow0);
    for (int64_t k = 0; k < valid_co; ++k) {
        float* o = out_rows[k] + ow0;
        if (n == NV * kLanes) {
            std::memcpy(o, acc[k], sizeof(acc[k]));
        } else {
            float tmp[NV * kLanes];
            std::memcpy(tmp, acc[k], sizeof(tmp));
            std::memcpy(o, tmp, size_t(n) * sizeof(float));
        }
    }
}

template <typename V, int NV>
inline __attribute__((always_inline)) void band_kernel(const Geometry& g, const Band& band, const float* wpack,
                                                       const float* bias_pad, const int64_t* col_off,
                                                       float* out) {
    constexpr int64_t kTile = NV * int64_t(sizeof(V) / sizeof(float));
    const int64_t blocks = (g.Co + kCoBlock - 1) / kCoBlock;
    const int64_t wblock = g.Ci * g.kt * g.kh * g.kw * kCoBlock;
    for (int64_t cb = 0; cb < blocks; ++cb) {
        const int64_t valid_co = std::min(kCoBlock, g.Co - cb * kCoBlock);
        for (int64_t r = 0; r < band.rows; ++r) {
            float* out_rows[kCoBlock] = {};
            for (int64_t k = 0; k < valid_co; ++k)
                out_rows[k] = out + (((cb * kCoBlock + k) * g.To + band.ot) * g.Ho + band.oh0 + r) * g.Wo;
            for (int64_t ow0 = 0; ow0 < g.Wo; ow0 += kTile)
                tile<V, NV>(g, band, wpack + cb * wblock, bias_pad + cb * kCoBlock, col_off, r, ow0, out_rows,
                            valid_co);
        }
    }
}

constexpr int64_t kTileGeneric = 8;  // V4 x 2
void band_generic(const Geometry& g, const Band& band, const float* wpack, const float* bias_pad,
                  const int64_t* col_off, float* out) {
    band_kernel<V4, 2>(g, band, wpack, bias_pad, col_off, out);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define DZR_CONV_AVX2 1
constexpr int64_t kTileAvx2 = 16;  // V8 x 2
__attribute__((target("avx2,fma"))) void band_avx2(const Geometry& g, const Band& band, const float* wpack,
                                                   const float* bias_pad, const int64_t* col_off, float* out) {
    band_kernel<V8, 2>(g, band, wpack, bias_pad, col_off, out);
}
#endif

/// Packs the input of output rows [oh0, oh0 + rows) of output frame ot: slab[ci][ai][hb][phase][q] =
/// x[ci, it, ih, iw] with it = ot*st - pt + a_lo + ai, ih = oh0*sh - ph + hb, iw = q*sw + phase - pw,
/// zero outside the input. Tap c of output column ow then reads phase c % sw at q = ow + c / sw.
void pack_band(const Geometry& g, const float* x, const Band& band, float* slab) {
    const int64_t row_len = g.sw * band.Wq;
    for (int64_t ci = 0; ci < g.Ci; ++ci)
        for (int64_t ai = 0; ai < band.A; ++ai) {
            const int64_t it = band.ot * g.st - g.pt + band.a_lo + ai;  // valid by construction
            for (int64_t hb = 0; hb < band.Hb; ++hb) {
                float* dst = slab + ((ci * band.A + ai) * band.Hb + hb) * row_len;
                const int64_t ih = band.oh0 * g.sh - g.ph + hb;
                if (ih < 0 || ih >= g.H) {
                    std::fill(dst, dst + row_len, 0.f);
                    continue;
                }
                const float* src = x + ((ci * g.T + it) * g.H + ih) * g.W;
                if (g.sw == 1) {
                    // columns q map to iw = q - pw: zeros, the row, zeros
                    const int64_t lo = std::min(g.pw, band.Wq);
                    const int64_t hi = std::clamp<int64_t>(g.W + g.pw, lo, band.Wq);
                    std::fill(dst, dst + lo, 0.f);
                    if (hi > lo) std::memcpy(dst + lo, src + (lo - g.pw), size_t(hi - lo) * sizeof(float));
                    std::fill(dst + hi, dst + band.Wq, 0.f);
                    continue;
                }
                for (int64_t ph = 0; ph < g.sw; ++ph) {
                    float* d = dst + ph * band.Wq;
                    for (int64_t q = 0; q < band.Wq; ++q) {
                        const int64_t iw = q * g.sw + ph - g.pw;
                        d[q] = iw >= 0 && iw < g.W ? src[iw] : 0.f;
                    }
                }
            }
        }
}

void conv_direct(const Geometry& g, const float* x, const float* w, const float* bias, float* out,
                 std::vector<float>& scratch, bool simd) {
    const bool avx2 = simd && conv_simd_available();
#ifdef DZR_CONV_AVX2
    const int64_t tile_w = avx2 ? kTileAvx2 : kTileGeneric;
#else
    const int64_t tile_w = kTileGeneric;
#endif
    const int64_t blocks = (g.Co + kCoBlock - 1) / kCoBlock;
    const int64_t taps = g.Ci * g.kt * g.kh * g.kw;
    // Packed columns per phase: every tile reads (Wo rounded up to the tile) + (kw - 1) / sw columns.
    const int64_t Wq = (g.Wo + tile_w - 1) / tile_w * tile_w + (g.kw - 1) / g.sw;
    const int64_t row_len = g.sw * Wq;
    const int64_t per_row = std::max<int64_t>(1, g.Ci * g.kt * row_len);
    const int64_t slab_rows = std::max(g.kh, kSlabBytes / int64_t(sizeof(float)) / per_row);
    const int64_t band_rows = std::clamp<int64_t>((slab_rows - g.kh) / g.sh + 1, 1, std::max<int64_t>(g.Ho, 1));
    const int64_t slab_floats = g.Ci * g.kt * ((band_rows - 1) * g.sh + g.kh) * row_len;

    // scratch: [packed weights | padded bias | slab]
    const int64_t wfloats = blocks * taps * kCoBlock;
    scratch.resize(size_t(wfloats + blocks * kCoBlock + slab_floats));
    float* wpack = scratch.data();
    float* bias_pad = wpack + wfloats;
    float* slab = bias_pad + blocks * kCoBlock;
    // w [Co, Ci, kt, kh, kw] -> [Co / 4][Ci, kt, kh, kw][4], zero channels past Co
    std::fill(wpack, wpack + wfloats, 0.f);
    for (int64_t co = 0; co < g.Co; ++co)
        for (int64_t t = 0; t < taps; ++t)
            wpack[((co / kCoBlock) * taps + t) * kCoBlock + co % kCoBlock] = w[co * taps + t];
    for (int64_t co = 0; co < blocks * kCoBlock; ++co) bias_pad[co] = bias && co < g.Co ? bias[co] : 0.f;

    int64_t col_off[64];
    DZR_CHECK(g.kw <= 64, "cpu backend: conv3d kernel width {} exceeds 64", g.kw);
    for (int64_t c = 0; c < g.kw; ++c) col_off[c] = (c % g.sw) * Wq + c / g.sw;

    for (int64_t ot = 0; ot < g.To; ++ot) {
        Band band;
        band.ot = ot;
        band.Wq = Wq;
        // temporal taps inside the input; the others multiply zero padding and are skipped
        const int64_t t0 = ot * g.st - g.pt;
        band.a_lo = std::max<int64_t>(0, -t0);
        band.A = std::max<int64_t>(0, std::min(g.kt, g.T - t0) - band.a_lo);
        for (int64_t oh0 = 0; oh0 < g.Ho; oh0 += band_rows) {
            band.oh0 = oh0;
            band.rows = std::min(band_rows, g.Ho - oh0);
            band.Hb = (band.rows - 1) * g.sh + g.kh;
            band.slab = slab;
            pack_band(g, x, band, slab);
#ifdef DZR_CONV_AVX2
            if (avx2) {
                band_avx2(g, band, wpack, bias_pad, col_off, out);
                continue;
            }
#endif
            band_generic(g, band, wpack, bias_pad, col_off, out);
        }
    }
}

// ---- im2col + GEMM path -------------------------------------------------------------------------

void conv_gemm(const Geometry& g, const float* x, const float* w, const float* bias, float* out,
               std::vector<float>& col) {
    const int64_t Kdim = g.Ci * g.kt * g.kh * g.kw, HoWo = g.Ho * g.Wo;
    const int64_t band_rows =
        std::clamp<int64_t>(kColumnBytes / int64_t(sizeof(float)) / std::max<int64_t>(1, Kdim * g.Wo), 1,
                            std::max<int64_t>(g.Ho, 1));
    col.resize(size_t(Kdim * band_rows * g.Wo));
    for (int64_t ot = 0; ot < g.To; ++ot) {
        for (int64_t oh0 = 0; oh0 < g.Ho; oh0 += band_rows) {
            const int64_t nh = std::min(band_rows, g.Ho - oh0), ncols = nh * g.Wo;
            // col[(ci, a, b, c), (oh, ow)] = x[ci, it, ih, iw] or 0 outside the input
            for (int64_t ci = 0; ci < g.Ci; ++ci)
                for (int64_t a = 0; a < g.kt; ++a) {
                    const int64_t it = ot * g.st - g.pt + a;
                    for (int64_t b = 0; b < g.kh; ++b)
                        for (int64_t c = 0; c < g.kw; ++c) {
                            float* crow = &col[size_t((((ci * g.kt + a) * g.kh + b) * g.kw + c) * ncols)];
                            // output columns whose input column is inside [0, W)
                            const int64_t lo = std::clamp<int64_t>((g.pw - c + g.sw - 1) / g.sw, 0, g.Wo);
                            const int64_t hi = std::clamp<int64_t>((g.W + g.pw - c + g.sw - 1) / g.sw, lo, g.Wo);
                            for (int64_t oh = 0; oh < nh; ++oh) {
                                float* d = crow + oh * g.Wo;
                                const int64_t ih = (oh0 + oh) * g.sh - g.ph + b;
                                if (it < 0 || it >= g.T || ih < 0 || ih >= g.H) {
                                    std::fill(d, d + g.Wo, 0.f);
                                    continue;
                                }
                                const float* xrow = x + ((ci * g.T + it) * g.H + ih) * g.W;
                                std::fill(d, d + lo, 0.f);
                                if (g.sw == 1 && hi > lo) {
                                    std::memcpy(d + lo, xrow + lo - g.pw + c, size_t(hi - lo) * sizeof(float));
                                } else {
                                    for (int64_t ow = lo; ow < hi; ++ow) d[ow] = xrow[ow * g.sw - g.pw + c];
                                }
                                std::fill(d + hi, d + g.Wo, 0.f);
                            }
                        }
                }
            // out[co, ot, band] = W[co, Kdim] · col[Kdim, ncols] (+ bias), ldc = To * Ho * Wo
            float* po = out + ot * HoWo + oh0 * g.Wo;
            const int64_t ldc = g.To * HoWo;
            float beta = 0.f;
            if (bias) {
                for (int64_t co = 0; co < g.Co; ++co) std::fill(po + co * ldc, po + co * ldc + ncols, bias[co]);
                beta = 1.f;
            }
            cpu::sgemm({false, false, g.Co, ncols, Kdim, 1.f, w, Kdim, col.data(), ncols, beta, po, ldc});
        }
    }
}

}  // namespace

bool conv_simd_available() {
#ifdef DZR_CONV_AVX2
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
#else
    return false;
#endif
}

void conv3d_f32(const Conv3dParams& p, const TensorView& x, const TensorView& w, const float* bias,
                const TensorView& out, std::vector<float>& scratch, ConvKernel kernel) {
    Geometry g;
    g.Ci = x.dim(0), g.T = x.dim(1), g.H = x.dim(2), g.W = x.dim(3);
    g.Co = w.dim(0), g.kt = w.dim(2), g.kh = w.dim(3), g.kw = w.dim(4);
    g.To = out.dim(1), g.Ho = out.dim(2), g.Wo = out.dim(3);
    g.st = p.stride[0], g.sh = p.stride[1], g.sw = p.stride[2];
    g.pt = p.pad_before[0], g.ph = p.pad_before[1], g.pw = p.pad_before[2];
    if (g.Co == 0 || g.To == 0 || g.Ho == 0 || g.Wo == 0) return;
    const float* px = static_cast<const float*>(x.data);
    const float* pw = static_cast<const float*>(w.data);
    float* po = static_cast<float*>(out.data);
    if (g.Ci == 0) {
        for (int64_t co = 0; co < g.Co; ++co)
            std::fill(po + co * g.To * g.Ho * g.Wo, po + (co + 1) * g.To * g.Ho * g.Wo, bias ? bias[co] : 0.f);
        return;
    }
    // NOTE: OpenBLAS wins once both the output channels and the reduction are wide; below that the
    // column matrix costs more than the multiply.
    if (kernel == ConvKernel::Auto) {
        const int64_t taps = g.Ci * g.kt * g.kh * g.kw;
        kernel = g.Co >= 64 && taps >= 256 ? ConvKernel::Gemm : ConvKernel::DirectSimd;
    }
    if (kernel == ConvKernel::Gemm)
        conv_gemm(g, px, pw, bias, po, scratch);
    else
        conv_direct(g, px, pw, bias, po, scratch, kernel == ConvKernel::DirectSimd);
}

}  // namespace dzr::cpu
