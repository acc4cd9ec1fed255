#!/usr/bin/env python3
"""Kernel-level checks against PyTorch: one bf16 op per case, run by torch as the reference calls it and by
dzr's CUDA backend (`dzr parity attention|linear|conv3d|bmm|op`) on the same operands, then a table of how many
output elements differ and by how much (docs/PARITY.md). Groups:
  attention  torch's SDPA backends (cuDNN, flash, efficient, math) vs every dzr attention implementation
  linear     F.linear (cuBLASLt addmm with a bias epilogue)
  bmm        torch.bmm vs dzr's batched GEMM through cuBLASLt and through cuBLAS (BatchedGemmImpl)
  op         LayerNorm, RMSNorm (the reference's formula), GELU (tanh, erf), SiLU
  conv       F.conv3d / F.conv2d as the DiT's and CLIP's patch embeddings and the VAE's convolutions run
             (for the patch embedding also dzr's former patchify + GEMM + bias add)
  wide       every GEMM shape of the real widths (configs/parity_wide.yaml: the DiT head, the blocks, the text and
             image embeddings, CLIP, umT5, the action and state heads), each under several settings on both sides:
             torch with its default cuBLASLt workspace and with CUBLASLT_WORKSPACE_SIZE=1024 / 32768 KiB; dzr with
             its default, DZR_LT_WORKSPACE=1024 (PyTorch's cuBLASLt default of 1 MiB), DZR_LT_ALIGN=torch, on
             PyTorch's bundled cuBLAS (LD_LIBRARY_PATH), and for bias-free GEMMs DZR_PLAIN_GEMM=cublas. One line per
             shape: how many output elements of each differ from torch's default. With --cublaslt-log the head
             shape runs once more on both sides with CUBLASLT_LOG_LEVEL=5 (the heuristic's preference and the
             algorithm each side ran).

Usage (GPU machine): kernel_probe.py --dzr build/bin/dzr --out OUT [--cases A,B | --cases none]
[--skip linear,bmm,op,conv] [--cudnn-log]. With --cudnn-log, cuDNN's API log (CUDNN_LOGLEVEL_DBG=3) and the
frontend's log of each side go to OUT, so the operation graphs and engine configs can be compared. Each side runs
in its own process (the logging variables are read when cuDNN loads). DZR_LD_LIBRARY_PATH, when set, is
prepended to dzr's LD_LIBRARY_PATH (e.g. PyTorch's bundled cuDNN, to run both sides on one cuDNN build).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# (name, Lq, Lk, heads, head_dim, amplitude of q and k): the DiT's self- and cross-attention shapes at the
# parity geometry, and the real model's head count for one case.
CASES = [
    ("self_880", 880, 880, 2, 128, 3.0),
    ("self_1760x2640", 1760, 2640, 2, 128, 3.0),
    ("cross_text_880x512", 880, 512, 2, 128, 3.0),
    ("cross_img_880x257", 880, 257, 2, 128, 3.0),
    ("self_880_soft", 880, 880, 2, 128, 1.0),
    ("real_1785x2665_h40", 1785, 2665, 40, 128, 3.0),
    ("clip_257_h16_d80", 257, 257, 16, 80, 1.0),  # CLIP ViT-H/14: 16 heads of 80
    ("vae_mid_3520_h1_d384", 3520, 3520, 1, 384, 1.0),  # the VAE's mid-block attention (44x80 tokens, one head)
    # torch's memory-efficient backend (head dims above 256): one key block, partial blocks, two heads
    ("memeff_200x100_h1_d384", 200, 100, 1, 384, 1.0),
    ("memeff_777x1000_h2_d320", 777, 1000, 2, 320, 3.0),
]
# (name, M, K, N, bias): the DiT's Linear shapes at the parity geometry and one of the real model's
LINEARS = [
    ("qkvo_880x256x256", 880, 256, 256, True),
    ("text_512x64x256", 512, 64, 256, True),
    ("ffn_up_880x256x512", 880, 256, 512, True),
    ("ffn_down_880x512x256", 880, 512, 256, True),
    ("q_1760x256x256", 1760, 256, 256, True),
    ("real_1785x5120x5120", 1785, 5120, 5120, True),
    ("nobias_880x256x256", 880, 256, 256, False),
    # umT5's bias-free Linears (F.linear without a bias runs torch.mm): parity widths and the real ones
    ("t5_q_512x64x64", 512, 64, 64, False),
    ("t5_ffn_512x64x128", 512, 64, 128, False),
    ("t5_fc2_512x128x64", 512, 128, 64, False),
    ("t5_real_q_512x4096x4096", 512, 4096, 4096, False),
    ("t5_real_ffn_512x4096x10240", 512, 4096, 10240, False),
    ("t5_real_fc2_512x10240x4096", 512, 10240, 4096, False),
]
# (name, M, K, N, rows): a Linear with bias that the reference runs on M rows (one per token: the DiT's time
# embedding and projection) and dzr on the distinct rows only; compared on those rows
LINEAR_ROWS = [
    ("time_emb0_1785x256x256", 1785, 256, 256, (0, 1760)),
    ("time_proj_1785x256x1536", 1785, 256, 1536, (0, 1760)),
    ("time_emb0_880x256x256", 880, 256, 256, (0,)),
    ("time_proj_880x256x1536", 880, 256, 1536, (0,)),
    ("real_time_emb0_1785x256x5120", 1785, 256, 5120, (0, 1760)),
    ("real_time_emb2_1785x5120x5120", 1785, 5120, 5120, (0, 1760)),
    ("real_time_proj_1785x5120x30720", 1785, 5120, 30720, (0, 1760)),
]
# (name, x [Ci, T, H, W], Co, kernel, stride, pad_before (t, h, w), pad_after, mode): mode "3d" is a Conv3d,
# "3d+gemm" also checks dzr's former patchify + GEMM, "2d" a Conv2d over the frames (--frames-2d)
CONVS = [
    ("patch_embed_1x44x80", (36, 1, 44, 80), 256, (1, 2, 2), (1, 2, 2), (0, 0, 0), (0, 0, 0), "3d+gemm"),
    ("patch_embed_2x44x80", (36, 2, 44, 80), 256, (1, 2, 2), (1, 2, 2), (0, 0, 0), (0, 0, 0), "3d+gemm"),
    ("patch_embed_real_2x44x80", (36, 2, 44, 80), 5120, (1, 2, 2), (1, 2, 2), (0, 0, 0), (0, 0, 0), "3d+gemm"),
    ("vae_conv_in_1x352x640", (3, 1, 352, 640), 96, (3, 3, 3), (1, 1, 1), (2, 1, 1), (0, 1, 1), "3d"),
    ("vae_res_96_3x88x160", (96, 3, 88, 160), 96, (3, 3, 3), (1, 1, 1), (2, 1, 1), (0, 1, 1), "3d"),
    ("vae_time_conv_384_4x44x80", (384, 4, 44, 80), 768, (3, 1, 1), (1, 1, 1), (2, 0, 0), (0, 0, 0), "3d"),
    # the VAE's spatial downsampling is a Conv2d per frame after ZeroPad2d((0, 1, 0, 1)): run as conv2d on the
    # torch side
    ("vae_down2d_96_2x352x640", (96, 2, 352, 640), 96, (1, 3, 3), (1, 2, 2), (0, 0, 0), (0, 1, 1), "2d"),
    ("vae_up2d_192_2x88x160", (192, 2, 88, 160), 96, (1, 3, 3), (1, 1, 1), (0, 1, 1), (0, 1, 1), "2d"),
    ("vae_attn_qkv_384_1x44x80", (384, 1, 44, 80), 1152, (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0), "2d"),
    ("vae_attn_proj_384_4x44x80", (384, 4, 44, 80), 384, (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0), "2d"),
    ("clip_patch_1x224x224", (3, 1, 224, 224), 1280, (1, 14, 14), (1, 14, 14), (0, 0, 0), (0, 0, 0), "2d"),
    # the VAE encoder's convolutions of a 4-frame chunk (its temporal cache makes the time padding 2 frames; the
    # time convs of the downsampling see 1 cached + 4 frames, stride 2 in time)
    ("vae_conv_in_4x352x640", (3, 4, 352, 640), 96, (3, 3, 3), (1, 1, 1), (2, 1, 1), (0, 1, 1), "3d"),
    ("vae_res_96_4x352x640", (96, 4, 352, 640), 96, (3, 3, 3), (1, 1, 1), (2, 1, 1), (0, 1, 1), "3d"),
    ("vae_down2d_96_4x352x640", (96, 4, 352, 640), 96, (1, 3, 3), (1, 2, 2), (0, 0, 0), (0, 1, 1), "2d"),
    ("vae_res_96_192_4x176x320", (96, 4, 176, 320), 192, (3, 3, 3), (1, 1, 1), (2, 1, 1), (0, 1, 1), "3d"),
    ("vae_res_192_4x176x320", (192, 4, 176, 320), 192, (3, 3, 3), (1, 1, 1), (2, 1, 1), (0, 1, 1), "3d"),
    ("vae_res_192_384_2x88x160", (192, 2, 88, 160), 384, (3, 3, 3), (1, 1, 1), (2, 1, 1), (0, 1, 1), "3d"),
    ("vae_short_192_384_2x88x160", (192, 2, 88, 160), 384, (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0), "3d"),
    ("vae_short_96_192_4x176x320", (96, 4, 176, 320), 192, (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0), "3d"),
    ("vae_down2d_192_4x176x320", (192, 4, 176, 320), 192, (1, 3, 3), (1, 2, 2), (0, 0, 0), (0, 1, 1), "2d"),
    ("vae_tdown_192_4x88x160", (192, 4, 88, 160), 192, (3, 1, 1), (2, 1, 1), (1, 0, 0), (0, 0, 0), "3d"),
    ("vae_res_384_2x88x160", (384, 2, 88, 160), 384, (3, 3, 3), (1, 1, 1), (2, 1, 1), (0, 1, 1), "3d"),
    ("vae_tdown_384_2x44x80", (384, 2, 44, 80), 384, (3, 1, 1), (2, 1, 1), (1, 0, 0), (0, 0, 0), "3d"),
    # CLIP's patch embedding (no bias) on a channels-last input: the reference's frame at a reset inside a rollout
    ("clip_patch_cl_1x224x224", (3, 1, 224, 224), 1280, (1, 14, 14), (1, 14, 14), (0, 0, 0), (0, 0, 0), "2d_cl"),
]
# (name, op, rows, cols, weight, bias, eps): the DiT's norms and activations at the parity and the real width
OPS = [
    ("ln_880x256", "layer_norm", 880, 256, False, False, 1e-6),
    ("ln_affine_880x256", "layer_norm", 880, 256, True, True, 1e-6),
    ("ln_1785x5120", "layer_norm", 1785, 5120, False, False, 1e-6),
    ("ln_img_257x1280", "layer_norm", 257, 1280, True, True, 1e-5),
    ("rms_880x256", "rms_norm", 880, 256, True, False, 1e-6),
    ("rms_1785x5120", "rms_norm", 1785, 5120, True, False, 1e-6),
    ("rms_512x256", "rms_norm", 512, 256, True, False, 1e-6),
    ("rms_1785x256", "rms_norm", 1785, 256, True, False, 1e-6),
    ("rms_257x256", "rms_norm", 257, 256, True, False, 1e-6),
    ("rms_t5_512x64", "rms_norm", 512, 64, True, False, 1e-6),
    ("rms_t5_real_512x4096", "rms_norm", 512, 4096, True, False, 1e-6),
    ("gelu_tanh_880x512", "gelu_tanh", 880, 512, False, False, 0.0),
    ("gelu_erf_257x5120", "gelu_erf", 257, 5120, False, False, 0.0),
    ("silu_880x256", "silu", 880, 256, False, False, 0.0),
    ("sigmoid_24x256", "sigmoid", 24, 256, False, False, 0.0),
    ("gelu_t5_512x128", "gelu_t5", 512, 128, False, False, 0.0),
    ("gelu_t5_512x10240", "gelu_t5", 512, 10240, False, False, 0.0),
    ("softmax_t5_1024x512", "softmax", 1024, 512, False, False, 0.0),
    ("softmax_1000x100", "softmax", 1000, 100, False, False, 0.0),
    ("softmax_64x2048", "softmax", 64, 2048, False, False, 0.0),
]
# (name, batch, M, K, N, b stored transposed): torch.bmm as the umT5 attention (einsum -> bmm over the heads)
# and the action/state encoders' CategorySpecificLinear (bmm over a batch of 1) run it
BMMS = [
    ("umt5_logits_h2_512x64x512", 2, 512, 64, 512, True),
    ("umt5_pv_h2_512x512x64", 2, 512, 512, 64, False),
    ("umt5_real_logits_h64_512x64x512", 64, 512, 64, 512, True),
    ("umt5_real_pv_h64_512x512x64", 64, 512, 512, 64, False),
    ("action_w1_1x24x32x256", 1, 24, 32, 256, False),
    ("action_w2_1x24x512x256", 1, 24, 512, 256, False),
    ("state_1x1x64x256", 1, 1, 64, 256, False),
]
# The real widths (configs/parity_wide.yaml), group `wide`: (name, kind, M, K, N, rows). kind "linear" = F.linear
# with a bias (addmm: cuBLASLt gemm_and_bias), "mm" = F.linear without one (torch.mm), "bmm" = torch.bmm over one
# batch (CategorySpecificLinear, b stored [K, N]). rows: torch runs M rows and dzr only these (the time embedding,
# which the reference evaluates per token and dzr per timestep group).
WIDE = [
    ("head_1760x5120x64", "linear", 1760, 5120, 64, None),  # CausalHead.head, a denoising forward (2 frames)
    ("head_880x5120x64", "linear", 880, 5120, 64, None),  # one frame (a prefill)
    ("head_2640x5120x64", "linear", 2640, 5120, 64, None),  # three frames
    ("qkvo_1785x5120x5120", "linear", 1785, 5120, 5120, None),  # q, k, v, o, cross q and o (denoising forward)
    ("qkvo_880x5120x5120", "linear", 880, 5120, 5120, None),
    ("ffn1_1785x5120x13824", "linear", 1785, 5120, 13824, None),
    ("ffn2_1785x13824x5120", "linear", 1785, 13824, 5120, None),
    ("text_emb1_512x4096x5120", "linear", 512, 4096, 5120, None),  # text_embedding, then the cross k and v
    ("text_emb2_512x5120x5120", "linear", 512, 5120, 5120, None),
    ("img_emb1_257x1280x1280", "linear", 257, 1280, 1280, None),  # img_emb's MLP, then the image k and v
    ("img_emb2_257x1280x5120", "linear", 257, 1280, 5120, None),
    ("img_kv_257x5120x5120", "linear", 257, 5120, 5120, None),
    ("clip_qkv_257x1280x3840", "linear", 257, 1280, 3840, None),  # CLIP ViT-H blocks
    ("clip_proj_257x1280x1280", "linear", 257, 1280, 1280, None),
    ("clip_fc1_257x1280x5120", "linear", 257, 1280, 5120, None),
    ("clip_fc2_257x5120x1280", "linear", 257, 5120, 1280, None),
    ("time_emb1_rows_1785x256x5120", "linear", 1785, 256, 5120, (0, 1760)),
    ("time_emb2_rows_1785x5120x5120", "linear", 1785, 5120, 5120, (0, 1760)),
    ("time_proj_rows_1785x5120x30720", "linear", 1785, 5120, 30720, (0, 1760)),
    ("t5_q_512x4096x4096", "mm", 512, 4096, 4096, None),  # umT5 (bias-free)
    ("t5_ffn_512x4096x10240", "mm", 512, 4096, 10240, None),
    ("t5_fc2_512x10240x4096", "mm", 512, 10240, 4096, None),
    ("act_dec1_24x5120x1024", "bmm", 24, 5120, 1024, None),  # action decoder
    ("act_dec2_24x1024x32", "bmm", 24, 1024, 32, None),
    ("state1_1x64x1024", "bmm", 1, 64, 1024, None),  # state encoder
    ("state2_1x1024x5120", "bmm", 1, 1024, 5120, None),
    ("act_w1_24x32x5120", "bmm", 24, 32, 5120, None),  # action encoder
    ("act_w2_24x10240x5120", "bmm", 24, 10240, 5120, None),
    ("act_w3_24x5120x5120", "bmm", 24, 5120, 5120, None),
]
# torch's settings (environment of the torch process), the first being the reference of every comparison
WIDE_TORCH = [("default", {}), ("lt1m", {"CUBLASLT_WORKSPACE_SIZE": "1024"}),
              ("lt32m", {"CUBLASLT_WORKSPACE_SIZE": "32768"})]
# dzr's settings; "torchlibs" runs dzr on PyTorch's bundled cuBLAS (its nvidia/cu13/lib first in LD_LIBRARY_PATH)
WIDE_DZR = [("default", {}), ("ws1m", {"DZR_LT_WORKSPACE": "1024"}),
            ("ws1m+align", {"DZR_LT_WORKSPACE": "1024", "DZR_LT_ALIGN": "torch"}), ("torchlibs", {"torchlibs": 1}),
            ("torchlibs+ws1m", {"torchlibs": 1, "DZR_LT_WORKSPACE": "1024"})]
# and for the bias-free GEMMs (which dzr runs through cuBLASLt unless DZR_PLAIN_GEMM=cublas)
WIDE_DZR_PLAIN = [("cublas", {"DZR_PLAIN_GEMM": "cublas"}),
                  ("cublas+torchlibs", {"DZR_PLAIN_GEMM": "cublas", "torchlibs": 1})]
TORCH_BACKENDS = ["CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]
GEMM_IMPLS = ("lt", "cublas")  # dzr's PlainGemmImpl for bias-free GEMMs (DZR_PLAIN_GEMM)


def save(work, prefix, **tensors):
    """Each torch tensor (None skipped) as WORK/PREFIX.NAME.npy in float32 (bf16 values convert exactly)."""
    for tag, t in tensors.items():
        if t is not None:
            np.save(os.path.join(work, f"{prefix}.{tag}.npy"), t.float().cpu().numpy())


def torch_side(work, cases):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    info = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    for name, lq, lk, h, d, amp in cases:
        # [1, L, H, D] buffers viewed as [1, H, L, D], as the reference's attention passes them
        q = (torch.randn(1, lq, h, d, device="cuda") * amp).bfloat16()
        k = (torch.randn(1, lk, h, d, device="cuda") * amp).bfloat16()
        v = torch.randn(1, lk, h, d, device="cuda").bfloat16()
        save(work, name, q=q[0], k=k[0], v=v[0])
        # the backend PyTorch picks itself, on the layout the reference passes: one [B, L, H*D] tensor per
        # operand (CLIP: chunks of one to_qkv output) rearranged "b s (n d) -> b n s d" (a strided view)
        qkv = torch.cat([t.reshape(1, t.shape[1], h * d) for t in (q, k, v)], dim=-1) if lq == lk else None
        if qkv is not None:
            qv, kv, vv = qkv.chunk(3, dim=-1)
        else:
            qv, kv, vv = (t.reshape(1, t.shape[1], h * d) for t in (q, k, v))
        with torch.no_grad():
            o = torch.nn.functional.scaled_dot_product_attention(
                *(t.unflatten(-1, (h, d)).transpose(1, 2) for t in (qv, kv, vv)))
        torch.cuda.synchronize()
        np.save(os.path.join(work, f"{name}.torch_DEFAULT.npy"), o.transpose(1, 2)[0].float().cpu().numpy())
        for be in TORCH_BACKENDS:
            try:
                with torch.no_grad(), sdpa_kernel(getattr(SDPBackend, be)):
                    o = torch.nn.functional.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
                torch.cuda.synchronize()
                np.save(os.path.join(work, f"{name}.torch_{be}.npy"), o.transpose(1, 2)[0].float().cpu().numpy())
            except Exception as e:  # a backend that refuses the shape
                info[f"{name}.{be}"] = f"refused: {e}"[:300]
    for name, m, k, n, bias in LINEARS:
        x = torch.randn(m, k, device="cuda").bfloat16()
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).bfloat16()
        b = (torch.randn(n, device="cuda") * 0.1).bfloat16() if bias else None
        with torch.no_grad():
            o = torch.nn.functional.linear(x, w, b)
        save(work, f"lin_{name}", x=x, w=w, b=b, torch=o)
    for name, m, k, n, keep in LINEAR_ROWS:
        x = torch.randn(m, k, device="cuda").bfloat16()
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).bfloat16()
        b = (torch.randn(n, device="cuda") * 0.1).bfloat16()
        with torch.no_grad():
            o = torch.nn.functional.linear(x, w, b)
        idx = list(keep)
        save(work, f"linrows_{name}", x=x[idx], w=w, b=b, torch=o[idx])
    for name, bsz, m, k, n, bt in BMMS:
        a = torch.randn(bsz, m, k, device="cuda").bfloat16()
        b = (torch.randn(bsz, n, k, device="cuda") if bt else torch.randn(bsz, k, n, device="cuda")).bfloat16()
        with torch.no_grad():
            o = torch.bmm(a, b.transpose(1, 2) if bt else b)
        save(work, f"bmm_{name}", a=a, b=b, torch=o)
    F = torch.nn.functional
    for name, op, nrows, cols, has_w, has_b, eps in OPS:
        x = (torch.randn(nrows, cols, device="cuda") * 2 + 0.3).bfloat16()
        w = (1 + 0.2 * torch.randn(cols, device="cuda")).bfloat16() if has_w else None
        b = (0.1 * torch.randn(cols, device="cuda")).bfloat16() if has_b else None
        with torch.no_grad():
            if op == "layer_norm":
                o = F.layer_norm(x, (cols,), w, b, eps)
            elif op == "rms_norm":  # the reference's WanRMSNorm / T5 norm: norm(x.float()).type_as(x) * weight
                xf = x.float()
                o = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).type_as(x) * w
            elif op == "gelu_tanh":
                o = F.gelu(x, approximate="tanh")
            elif op == "gelu_erf":
                o = F.gelu(x)
            elif op == "gelu_t5":  # umT5's GELU module (wan_video_text_encoder.py), eager ops on bf16
                o = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
            elif op == "sigmoid":
                o = torch.sigmoid(x)
            elif op == "softmax":  # umT5's attention: logits + bias (padded keys at the bf16 minimum), f32 softmax
                x = (torch.randn(nrows, cols, device="cuda") * 3).bfloat16()
                x[nrows // 2:, cols - cols // 5:] = torch.finfo(torch.bfloat16).min
                o = F.softmax(x.float(), dim=-1).type_as(x)
            else:
                o = F.silu(x)
        save(work, f"op_{name}", x=x, w=w, b=b, torch=o)
    for name, xs, co, ks, st, pb, pa, mode in CONVS:
        ci = xs[0]
        x = torch.randn(*xs, device="cuda").bfloat16()
        w = (torch.randn(co, ci, *ks, device="cuda") / (ci * ks[0] * ks[1] * ks[2]) ** 0.5).bfloat16()
        b = (torch.randn(co, device="cuda") * 0.1).bfloat16()
        with torch.no_grad():
            if mode == "2d_cl":  # no bias, the input channels-last (torch makes the weight channels-last too)
                b = None
                xc = x.transpose(0, 1).contiguous(memory_format=torch.channels_last)
                o = torch.nn.functional.conv2d(xc, w[:, :, 0], None, stride=st[1:]).transpose(0, 1)
            elif mode == "2d" and pb == pa:  # Conv2d(padding=...): cuDNN pads
                o = torch.nn.functional.conv2d(x.transpose(0, 1).contiguous(), w[:, :, 0], b, stride=st[1:],
                                               padding=pb[1:]).transpose(0, 1)
            elif mode == "2d":  # ZeroPad2d, then Conv2d
                xp = torch.nn.functional.pad(x.transpose(0, 1), (pb[2], pa[2], pb[1], pa[1]))
                o = torch.nn.functional.conv2d(xp, w[:, :, 0], b, stride=st[1:]).transpose(0, 1)
            else:
                xp = torch.nn.functional.pad(x[None], (pb[2], pa[2], pb[1], pa[1], pb[0], pa[0]))
                o = torch.nn.functional.conv3d(xp, w, b, stride=st)[0]
        save(work, f"conv_{name}", x=x, w=w, b=b, torch=o)
    return info


def torch_wide(work, tag, only=None):
    """The `wide` group's torch side under this process's environment: operands made on the first run (seeded,
    saved as WORK/wide_NAME.{x,w,b}.npy) and read back on later ones, the op as the reference calls it, the output
    saved as WORK/wide_NAME.torch_TAG.npy. Returns facts about the torch side's BLAS (library path and version,
    preferred backend)."""
    import torch

    F = torch.nn.functional
    for name, kind, m, k, n, rows in WIDE:
        if only and name not in only:
            continue
        base = os.path.join(work, f"wide_{name}")
        if not os.path.exists(base + ".x.npy"):
            g = torch.Generator(device="cuda").manual_seed(zlib.crc32(name.encode()))
            x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
            shape_w = (k, n) if kind == "bmm" else (n, k)
            w = (torch.randn(*shape_w, device="cuda", generator=g) / k ** 0.5).bfloat16()
            b = (torch.randn(n, device="cuda", generator=g) * 0.1).bfloat16() if kind == "linear" else None
            save(work, f"wide_{name}", x=x, w=w, b=b)
        x = torch.from_numpy(np.load(base + ".x.npy")).cuda().bfloat16()
        w = torch.from_numpy(np.load(base + ".w.npy")).cuda().bfloat16()
        b = torch.from_numpy(np.load(base + ".b.npy")).cuda().bfloat16() if kind == "linear" else None
        with torch.no_grad():
            if kind == "bmm":
                o = torch.bmm(x[None], w[None])[0]
            else:
                o = F.linear(x, w, b)
        if rows is not None:
            o = o[list(rows)]
        torch.cuda.synchronize()
        np.save(base + f".torch_{tag}.npy", o.float().cpu().numpy())
    facts = {"preferred_blas": str(torch.backends.cuda.preferred_blas_library())}
    with open("/proc/self/maps") as f:
        libs = sorted({line.split()[-1] for line in f if "libcublasLt" in line})
    facts["cublasLt"] = libs
    facts["cublasLt_version"] = [lt_version(p) for p in libs]
    return facts


def lt_version(path):
    """cublasLtGetVersion() of the library at `path` (loaded with ctypes), or the error."""
    import ctypes

    try:
        lib = ctypes.CDLL(path)
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        return int(lib.cublasLtGetVersion())
    except OSError as e:
        return f"? ({e})"


def torch_lib_dir():
    """PyTorch's bundled CUDA 13 libraries (nvidia/cu13/lib of its wheel), or None."""
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        d = os.path.join(root, "cu13", "lib")
        if os.path.isdir(d):
            return d
    return None


def bf16_round(a):
    """float32 -> the nearest bf16 (ties to even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def compare(a, b):
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    n = int((diff > 0).sum())
    rel_l2 = float(np.linalg.norm(diff) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))
    return n, a.size, float(diff.max()), rel_l2


def describe(a, b):
    n, total, mx, l2 = compare(a, b)
    return f"{n:8d}/{total} differ  max abs {mx:.3e}  rel l2 {l2:.3e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dzr", required=True)
    ap.add_argument("--work", default="/tmp/dzr-kernel-probe")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cudnn-log", action="store_true")
    ap.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases", default="", help="comma-separated attention case names (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated groups to skip: linear, op, conv, bmm, wide")
    ap.add_argument("--wide-only", default="", help="comma-separated `wide` shapes to run (default: all)")
    ap.add_argument("--wide-tag", default="default", help=argparse.SUPPRESS)
    ap.add_argument("--cublaslt-log", action="store_true",
                    help="with the wide group: cuBLASLt's API log (level 5) of the head shape on both sides")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    for group, table in (("linear", LINEARS), ("linear", LINEAR_ROWS), ("op", OPS), ("conv", CONVS), ("bmm", BMMS)):
        if group in skip:
            table.clear()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)

    wide_only = set(filter(None, args.wide_only.split(",")))
    if "wide" in skip:
        WIDE.clear()
    if args.torch_only:
        if args.wide_tag != "default":  # a further torch pass of the wide group under another environment
            print(json.dumps(torch_wide(args.work, args.wide_tag, wide_only)))
            return 0
        info = torch_side(args.work, cases)
        if WIDE:
            info["wide"] = torch_wide(args.work, "default", wide_only)
        print(json.dumps(info))
        return 0

    def env_for(side):
        env = dict(os.environ)
        if args.cudnn_log:
            env.update(CUDNN_LOGLEVEL_DBG="3", CUDNN_LOGDEST_DBG=os.path.join(args.out, f"cudnn_{side}.log"),
                       CUDNN_FRONTEND_LOG_INFO="1",
                       CUDNN_FRONTEND_LOG_FILE=os.path.join(args.out, f"cudnn_frontend_{side}.log"))
        return env

    base_cmd = [sys.executable, __file__, "--dzr", args.dzr, "--work", args.work, "--out", args.out, "--torch-only",
                "--cases", ",".join(c[0] for c in cases) or "none", "--skip", args.skip, "--wide-only", args.wide_only]
    r = subprocess.run(base_cmd, env=env_for("torch"), capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr, file=sys.stderr)
        return 1
    info = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"torch {info['torch']}, cuDNN {info['cudnn']}")
    wide_facts = {}
    if WIDE:
        wide_facts["default"] = info["wide"]
        for tag, extra in WIDE_TORCH[1:]:
            r = subprocess.run(base_cmd + ["--wide-tag", tag], env={**env_for("torch"), **extra},
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"torch wide pass {tag} failed:", r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
                return 1
            wide_facts[tag] = json.loads(r.stdout.strip().splitlines()[-1])
    denv = env_for("dzr")
    if os.environ.get("DZR_LD_LIBRARY_PATH"):
        denv["LD_LIBRARY_PATH"] = os.environ["DZR_LD_LIBRARY_PATH"] + ":" + denv.get("LD_LIBRARY_PATH", "")
    rows = []

    def check(case, label, ref_label, cmd, out, ref, log=None):
        """Runs dzr's command and adds a row comparing its output file with `ref` (or the failure)."""
        r = subprocess.run([args.dzr] + cmd, env=denv, capture_output=True, text=True)
        if log:
            with open(log, "w") as f:
                f.write(r.stdout + r.stderr)
        if r.returncode != 0:
            rows.append((case, label, ref_label, "failed: " + (r.stdout + r.stderr)[-300:]))
            return
        rows.append((case, label, ref_label, describe(np.load(out), ref)))

    for name, lq, lk, h, d, amp in cases:
        outdir = os.path.join(args.work, f"{name}.dzr")
        r = subprocess.run([args.dzr, "--log-level", "debug", "parity", "attention",
                            "--q", os.path.join(args.work, f"{name}.q.npy"),
                            "--k", os.path.join(args.work, f"{name}.k.npy"),
                            "--v", os.path.join(args.work, f"{name}.v.npy"), "--out", outdir],
                           env=denv, capture_output=True, text=True)
        with open(os.path.join(args.out, f"dzr_{name}.log"), "w") as f:
            f.write(r.stdout + r.stderr)
        if r.returncode != 0:  # an implementation that refuses the shape; compare the ones that ran
            print(f"{name}: dzr failed:\n{r.stdout}{r.stderr}")
            if not os.path.isdir(outdir):
                continue
        for ref_be in ("DEFAULT", "CUDNN_ATTENTION", "FLASH_ATTENTION"):
            ref_path = os.path.join(args.work, f"{name}.torch_{ref_be}.npy")
            if not os.path.exists(ref_path):
                rows.append((name, "-", ref_be, info.get(f"{name}.{ref_be}", "missing")))
                continue
            ref = np.load(ref_path)
            others = [("dzr " + f[2:-4], os.path.join(outdir, f)) for f in sorted(os.listdir(outdir))]
            others += [("torch " + b, os.path.join(args.work, f"{name}.torch_{b}.npy"))
                       for b in TORCH_BACKENDS if b != ref_be]
            for label, path in others:
                if not os.path.exists(path):
                    continue
                rows.append((name, label, ref_be, describe(np.load(path), ref)))
    def linear(label, base, bias, impl=None):
        env_impl = denv.get("DZR_PLAIN_GEMM")
        if impl:
            denv["DZR_PLAIN_GEMM"] = impl
        out = base + f".dzr_{impl or 'default'}.npy"
        check(label, f"dzr linear{' ' + impl if impl else ''}", "F.linear",
              ["parity", "linear", "--x", base + ".x.npy", "--w", base + ".w.npy", "--out", out]
              + (["--b", base + ".b.npy"] if bias else []), out, np.load(base + ".torch.npy"))
        if env_impl is None:
            denv.pop("DZR_PLAIN_GEMM", None)
        else:
            denv["DZR_PLAIN_GEMM"] = env_impl

    for name, m, k, n, bias in LINEARS:
        base = os.path.join(args.work, f"lin_{name}")
        for impl in ((None,) if bias else GEMM_IMPLS):  # the setting applies to bias-free GEMMs only
            linear(f"linear {name}", base, bias, impl)
    for name, m, k, n, keep in LINEAR_ROWS:
        linear(f"rows {name}", os.path.join(args.work, f"linrows_{name}"), True)
    for name, bsz, m, k, n, bt in BMMS:
        base = os.path.join(args.work, f"bmm_{name}")
        ref = np.load(base + ".torch.npy")
        for impl in GEMM_IMPLS:
            out = f"{base}.{impl}.npy"
            check(f"bmm {name}", f"dzr {impl}", "torch.bmm",
                  ["parity", "bmm", "--a", base + ".a.npy", "--b", base + ".b.npy", "--impl", impl, "--out", out]
                  + (["--b-transposed"] if bt else []), out, ref)
    for name, op, nrows, cols, has_w, has_b, eps in OPS:
        base = os.path.join(args.work, f"op_{name}")
        check(f"op {name}", f"dzr {op}", "torch",
              ["parity", "op", "--op", op, "--x", base + ".x.npy", "--eps", repr(eps), "--out", base + ".dzr.npy"]
              + (["--w", base + ".w.npy"] if has_w else []) + (["--b", base + ".b.npy"] if has_b else []),
              base + ".dzr.npy", np.load(base + ".torch.npy"))
    for name, xs, co, ks, st, pb, pa, mode in CONVS:
        base = os.path.join(args.work, f"conv_{name}")
        ref = np.load(base + ".torch.npy")
        bias = [] if mode == "2d_cl" else ["--b", base + ".b.npy"]
        flags = {"2d": ["--frames-2d"], "2d_cl": ["--frames-2d", "--channels-last"]}.get(mode, [])
        # cuDNN's graph API with PyTorch's engine choice (dzr's default), then the legacy API's v7 heuristics
        for api in ("graph", "legacy"):
            out = base + f".dzr_{api}.npy"
            env_api = denv.get("DZR_CONV_API")
            denv["DZR_CONV_API"] = api
            check(f"conv {name}", f"dzr conv3d {api}", "F.conv3d",
                  ["--log-level", "debug", "parity", "conv3d", "--x", base + ".x.npy", "--w", base + ".w.npy"] + bias +
                  ["--out", out, "--stride", *map(str, st), "--pad-before", *map(str, pb),
                   "--pad-after", *map(str, pa)] + flags,
                  out, ref, log=os.path.join(args.out, f"dzr_conv_{name}_{api}.log"))
            if env_api is None:
                denv.pop("DZR_CONV_API")
            else:
                denv["DZR_CONV_API"] = env_api
        if mode == "3d+gemm":
            # the DiT's former patch embedding: patchify [L, Ci*kh*kw] (channel, then kernel row, then column),
            # a GEMM without bias (rounded), then the bias add (rounded)
            x, w, b = np.load(base + ".x.npy"), np.load(base + ".w.npy"), np.load(base + ".b.npy")
            ci, t, h, wd = x.shape
            kh, kw = ks[1], ks[2]
            p = x.reshape(ci, t, h // kh, kh, wd // kw, kw).transpose(1, 2, 4, 0, 3, 5).reshape(-1, ci * kh * kw)
            np.save(base + ".patches.npy", np.ascontiguousarray(p))
            np.save(base + ".w2.npy", np.ascontiguousarray(w.reshape(co, -1)))
            r = subprocess.run([args.dzr, "parity", "linear", "--x", base + ".patches.npy", "--w", base + ".w2.npy",
                                "--out", base + ".gemm.npy"], env=denv, capture_output=True, text=True)
            if r.returncode == 0:
                g = bf16_round(np.load(base + ".gemm.npy") + b[None, :])  # [L, Co]
                g = g.reshape(t, h // kh, wd // kw, co).transpose(3, 0, 1, 2)
                rows.append((f"conv {name}", "dzr patchify+gemm", "F.conv3d", describe(g, ref)))
    with open(os.path.join(args.out, "kernel_probe.txt"), "w") as f:
        for row in rows:
            line = f"{row[0]:22s} {row[1]:24s} vs torch {row[2]:20s} {row[3]}"
            print(line)
            f.write(line + "\n")
    if WIDE:
        wide(args, denv, wide_facts, wide_only)
    return 0


def wide(args, denv, facts, only):
    """The `wide` group's dzr side and its table (see the module's doc)."""
    tlib = torch_lib_dir()
    r = subprocess.run(["ldd", args.dzr], capture_output=True, text=True)
    dzr_lt = sorted({ln.split("=>")[1].split()[0] for ln in r.stdout.splitlines() if "libcublasLt" in ln and "=>" in ln})
    lines = [f"wide: torch preferred BLAS {facts['default'].get('preferred_blas')}; torch's cuBLASLt "
             f"{facts['default'].get('cublasLt')} version {facts['default'].get('cublasLt_version')}; dzr's "
             f"{dzr_lt} version {[lt_version(p) for p in dzr_lt]}; PyTorch's bundled libraries: {tlib}"]

    def run_dzr(kind, base, out, settings, log_file=None):
        env = dict(denv)
        for key, value in settings.items():
            if key == "torchlibs":
                if not tlib:
                    return "no-lib"
                env["LD_LIBRARY_PATH"] = tlib + ":" + env.get("LD_LIBRARY_PATH", "")
            else:
                env[key] = value
        if log_file:
            env.update(CUBLASLT_LOG_LEVEL="5", CUBLASLT_LOG_FILE=log_file)
        if kind == "bmm":  # the operands with their batch of one (made by the caller)
            cmd = ["parity", "bmm", "--a", base + ".x3.npy", "--b", base + ".w3.npy", "--out", out,
                   "--impl", settings.get("DZR_PLAIN_GEMM", "lt")]
        else:
            cmd = ["parity", "linear", "--x", base + ".xr.npy", "--w", base + ".w.npy", "--out", out]
            if kind == "linear":
                cmd += ["--b", base + ".b.npy"]
        r = subprocess.run([args.dzr] + cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            return "failed: " + (r.stdout + r.stderr).strip().splitlines()[-1][-120:]
        return None

    cases = [c for c in WIDE if not only or c[0] in only]
    jobs = []  # (case name, tag, kind, base, settings); dzr's runs go in parallel (each its own process)
    for name, kind, m, k, n, rows in cases:
        base = os.path.join(args.work, f"wide_{name}")
        x = np.load(base + ".x.npy")
        np.save(base + ".xr.npy", x if rows is None else np.ascontiguousarray(x[list(rows)]))
        if kind == "bmm":  # one batch: a [1, M, K], b [1, K, N]
            np.save(base + ".x3.npy", x[None])
            np.save(base + ".w3.npy", np.load(base + ".w.npy")[None])
        for tag, settings in WIDE_DZR + (WIDE_DZR_PLAIN if kind != "linear" else []):
            jobs.append((name, tag, kind, base, settings))
    with ThreadPoolExecutor(max_workers=6) as pool:
        errs = list(pool.map(lambda j: run_dzr(j[2], j[3], j[3] + f".dzr_{j[1]}.npy", j[4]), jobs))
    results = {}
    for (name, tag, kind, base, settings), err in zip(jobs, errs):
        ref = np.load(base + ".torch_default.npy")
        cell = err if err else compare(np.load(base + f".dzr_{tag}.npy").reshape(ref.shape), ref)[0]
        results.setdefault(name, []).append(f"{tag}={cell}")
    for name, kind, m, k, n, rows in cases:
        base = os.path.join(args.work, f"wide_{name}")
        ref = np.load(base + ".torch_default.npy")
        cells = [f"{tag}={compare(np.load(base + f'.torch_{tag}.npy'), ref)[0]}" for tag, _ in WIDE_TORCH[1:]]
        lines.append(f"wide {name:32s} of {ref.size:9d}  torch {' '.join(cells)} | dzr {' '.join(results[name])}")
    if args.cublaslt_log and any(w[0] == "head_1760x5120x64" for w in WIDE):
        name = "head_1760x5120x64"
        base = os.path.join(args.work, f"wide_{name}")
        logs = {"torch": os.path.join(args.out, "cublaslt_torch_head.log")}
        env = {**os.environ, "CUBLASLT_LOG_LEVEL": "5", "CUBLASLT_LOG_FILE": logs["torch"]}
        subprocess.run([sys.executable, __file__, "--dzr", args.dzr, "--work", args.work, "--out", args.out,
                        "--torch-only", "--cases", "none", "--skip", "linear,op,conv,bmm", "--wide-only", name,
                        "--wide-tag", "log"], env=env, capture_output=True, text=True)
        for tag, settings in WIDE_DZR[:2]:
            logs[f"dzr {tag}"] = os.path.join(args.out, f"cublaslt_dzr_{tag}_head.log")
            run_dzr("linear", base, base + ".dzr_log.npy", settings, log_file=logs[f"dzr {tag}"])
        for who, path in logs.items():
            try:
                with open(path, errors="replace") as f:
                    hits = [ln.strip() for ln in f if ("Heuristic" in ln or "Matmul" in ln) and "64" in ln]
            except OSError:
                hits = ["(no log)"]
            lines.append(f"cublaslt log {who}: {len(hits)} heuristic/matmul lines (all in {os.path.basename(path)})")
            lines += ["  " + h[:300] for h in hits[:3]]
    with open(os.path.join(args.out, "wide.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
