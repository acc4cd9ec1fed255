#pragma once
/// Elementwise launchers: binary ops with broadcasting, affine scale, and the row/channel bias adds
/// the GEMM and conv3d paths use. Float dtypes are f32 or bf16; the math runs in f32.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

enum class BinOp : uint8_t { Add, Sub, Mul, Div };

/// out [rows, 2·half]: sin(t · expf(−j · step)) then cos(...) per row t, in f32 with the device's expf, sinf and
/// cosf (as PyTorch evaluates the action encoder's sinusoid on the GPU), stored in out's dtype.
cudaError_t sin_cos_table(float step, int64_t rows, int64_t half, void* out, DType to, cudaStream_t stream);

/// out[i] = a[i] op b[i % nb] for i < n (nb divides n; nb == 1 broadcasts a scalar). All contiguous;
/// out may alias a.
cudaError_t binary(BinOp op, const void* a, DType ta, const void* b, DType tb, void* out, DType to, int64_t n,
                   int64_t nb, cudaStream_t stream);

/// out[i] = alpha * x[i] + beta. Contiguous; out may alias x.
cudaError_t scale(const void* x, DType tx, void* out, DType to, int64_t n, float alpha, float beta,
                  cudaStream_t stream);

/// Epilogue over a batch of row-strided matrices out[b][m, n] (element (b, m, n) at
/// b * batch_stride + m * ld + n): when `apply_beta`, out = beta * out (beta == 0 writes 0 without
/// reading out); then, with a bias (f32 or bf16, length N), out += bias[n].
cudaError_t rows_epilogue(void* out, DType to, int64_t batch, int64_t M, int64_t N, int64_t ld,
                          int64_t batch_stride, bool apply_beta, float beta, const void* bias, DType tbias,
                          cudaStream_t stream);

/// out[c, s] += bias[c] for a contiguous [C, S] tensor (per-channel bias of a convolution).
cudaError_t channel_bias(void* out, DType to, int64_t C, int64_t S, const void* bias, DType tbias,
                         cudaStream_t stream);

}  // namespace dzr::kernels
