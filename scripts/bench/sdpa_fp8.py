#!/usr/bin/env python3
"""Would FP8 attention pay at the DiT's self-attention shapes? cuDNN's per-tensor FP8 SDPA against its bf16 SDPA.

Issue #14's lever: the self-attention is about a quarter of an FP8 step. This probe times, at the shapes of the
batched self-attention (both CFG branches as batch 2, 40 heads x 128, Lq 1785, Lk = history + 1785 at each window
fill), cuDNN's bf16 SDPA and its FP8 SDPA (E4M3 Q, K, V with per-tensor descales, P quantized to E4M3 by cuDNN,
O in bf16, or E4M3 where bf16 is refused), each **sustained** (rounds of back-to-back calls, as a replayed forward runs
them, the two kinds interleaved), with the GPU's energy per call (NVML) because the H200 runs at its power cap in a
rollout, where time follows energy. Then the error of each against an fp32 reference of the same inputs (rel l2,
max abs over max |ref|), on rows shaped like the DiT's: q and k RMS-normalized per row (times a gain that sets how
peaked the softmax is), v standard normal.

Needs the cudnn-frontend Python package (`nvidia-cudnn-frontend`; the GPU machine has none: carry its wheel, e.g. in
the git-ignored .whl/, and `pip install --no-deps --target /tmp/cfe .whl/nvidia_cudnn_frontend-*-cp312-*.whl`, then
PYTHONPATH=/tmp/cfe). Usage: python3 scripts/bench/sdpa_fp8.py [--rounds 5] [--ms 300] [--plans]
(--plans first times every plan cuDNN's heuristics offer for the bf16 SDPA, and knob variations of them.)
"""
import argparse
import ctypes
import math
import statistics
import sys
import time

import torch

import cudnn

H, D, LQ, B = 40, 128, 1785, 2
E4M3_MAX = 448.0


class Nvml:
    """Total energy of GPU 0 in millijoules (NVML through ctypes); None where NVML is missing."""

    def __init__(self):
        self.dev = None
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            if self.lib.nvmlInit_v2() != 0:
                return
            dev = ctypes.c_void_p()
            bus = torch.cuda.get_device_properties(0).pci_bus_id if hasattr(
                torch.cuda.get_device_properties(0), "pci_bus_id") else None
            if bus and self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(dev)) == 0:
                self.dev = dev
            elif self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0:
                self.dev = dev
        except OSError:
            pass

    def energy_mj(self):
        if self.dev is None:
            return None
        e = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(e)) != 0:
            return None
        return e.value


def backend_version():
    try:
        return cudnn.backend_version()
    except Exception:  # noqa: BLE001 - older packages name it differently
        return "?"


def bshd_stride(s):
    return (s * H * D, D, H * D, 1)


def make_graph(handle, lk, fp8, out_type):
    """The SDPA graph (bf16, or per-tensor FP8 with its scale tensors: uids 5-12) with its plans listed."""
    io = cudnn.data_type.FP8_E4M3 if fp8 else cudnn.data_type.BFLOAT16
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    q = g.tensor(uid=1, dim=(B, H, LQ, D), stride=bshd_stride(LQ), data_type=io)
    k = g.tensor(uid=2, dim=(B, H, lk, D), stride=bshd_stride(lk), data_type=io)
    v = g.tensor(uid=3, dim=(B, H, lk, D), stride=bshd_stride(lk), data_type=io)
    scale = 1.0 / math.sqrt(D)
    if fp8:
        sc = {}
        for uid, name in ((5, "dq"), (6, "dk"), (7, "dv"), (8, "ds"), (9, "ss"), (10, "so")):
            sc[name] = g.tensor(uid=uid, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=cudnn.data_type.FLOAT)
        o, _stats, amax_s, amax_o = g.sdpa_fp8(q=q, k=k, v=v, descale_q=sc["dq"], descale_k=sc["dk"],
                                               descale_v=sc["dv"], descale_s=sc["ds"], scale_s=sc["ss"],
                                               scale_o=sc["so"], generate_stats=False, attn_scale=scale,
                                               use_causal_mask=False)
        for uid, amax in ((11, amax_s), (12, amax_o)):
            amax.set_uid(uid).set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(
                cudnn.data_type.FLOAT)
    else:
        o, _stats = g.sdpa(q=q, k=k, v=v, generate_stats=False, attn_scale=scale)
    o.set_uid(4).set_output(True).set_dim((B, H, LQ, D)).set_stride(bshd_stride(LQ)).set_data_type(out_type)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g


def build(handle, lk, fp8, out_type):
    """make_graph with its plans built (the first supported one runs)."""
    g = make_graph(handle, lk, fp8, out_type)
    g.check_support()
    g.build_plans()
    return g


def plan_sweep(handle, lk, ms, nvml, dev):
    """Every plan cuDNN's heuristics offer for the bf16 SDPA at `lk` keys, and knob variations of each (the values
    around the plan's own), timed sustained: is the heuristic's first plan the one to take?"""
    q = torch.randn(B, LQ, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, lk, H, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, lk, H, D, device=dev, dtype=torch.bfloat16)
    o = torch.empty(B, LQ, H, D, device=dev, dtype=torch.bfloat16)
    pack = {1: q, 2: k, 3: v, 4: o}
    g = make_graph(handle, lk, False, cudnn.data_type.BFLOAT16)
    n = g.get_execution_plan_count()
    seen = []
    for i in range(n):
        try:
            seen.append(g.get_engine_and_knobs_at_index(i))
        except Exception as e:  # noqa: BLE001
            print(f"  plan {i}: no engine/knobs ({str(e).splitlines()[0][:120]})")
    base = list(seen)
    for engine_id, knobs in base:
        try:
            knobs = dict(knobs or {})
        except (TypeError, ValueError):
            print(f"  engine {engine_id}: knobs {knobs!r} not a dict, not varied")
            continue
        for kt, val in knobs.items():
            if not isinstance(val, int):
                continue
            for cand in {val // 2, val * 2, val + 1, val - 1, 0, 1, 2, 3, 64, 128, 256}:
                if cand < 0 or cand == val:
                    continue
                trial = dict(knobs)
                trial[kt] = cand
                try:
                    g.create_execution_plan(engine_id, trial)
                    seen.append((engine_id, trial))
                except Exception:  # noqa: BLE001 - a knob value the engine refuses
                    pass
    print(f"lk {lk}: {n} heuristic plans, {len(seen) - len(base)} knob variations accepted")
    results = []
    for i in range(g.get_execution_plan_count()):
        try:
            g.build_plan_at_index(i)
            ws = torch.empty(max(g.get_workspace_size_plan_at_index(i), 1), device=dev, dtype=torch.uint8)
            run = lambda: g.execute_plan_at_index(pack, ws, i, handle=handle)  # noqa: E731
            run()
            times, joules = [], []
            for _ in range(3):
                t, j = sustained(run, ms, nvml)
                times.append(t)
                joules.append(j)
            name = g.get_plan_name_at_index(i)
            eng = g.get_engine_and_knobs_at_index(i)
            results.append((statistics.median(times), statistics.median(joules), i, name, eng))
        except Exception as e:  # noqa: BLE001 - a plan that does not build or run: report it
            print(f"  plan {i}: {str(e).splitlines()[0][:160]}")
    flops = 4 * B * LQ * lk * H * D
    for t, j, i, name, eng in sorted(results):
        print(f"  plan {i:3d} {name} {eng}: {t:.4f} ms ({flops / t / 1e9:.0f} TFLOP/s), {j:.4f} J")


def reference(q, k, v):
    """fp32 attention, [B, S, H, D] rows, one batch and a few heads at a time."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(B):
        for h0 in range(0, H, 8):
            qs = q[b, :, h0:h0 + 8].float().transpose(0, 1)
            ks = k[b, :, h0:h0 + 8].float().transpose(0, 1)
            vs = v[b, :, h0:h0 + 8].float().transpose(0, 1)
            s = torch.matmul(qs, ks.transpose(1, 2)) / math.sqrt(D)
            out[b, :, h0:h0 + 8] = torch.matmul(torch.softmax(s, dim=-1), vs).transpose(0, 1)
    return out


def errors(o, ref):
    d = o.float() - ref
    return (d.norm() / ref.norm()).item(), (d.abs().max() / ref.abs().max()).item()


def sustained(fn, ms, nvml):
    """Median ms per call over back-to-back runs of about `ms` milliseconds, and joules per call."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 0
    while (time.perf_counter() - t0) * 1e3 < 30:
        fn()
        n += 1
        torch.cuda.synchronize()
    per = max((time.perf_counter() - t0) * 1e3 / n, 1e-3)
    reps = max(int(ms / per), 5)
    e0 = nvml.energy_mj()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    e1 = nvml.energy_mj()
    joules = (e1 - e0) / 1e3 / reps if e0 is not None and e1 is not None else float("nan")
    return a.elapsed_time(b) / reps, joules


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ms", type=float, default=300.0)
    ap.add_argument("--gains", default="1,2,3", help="q/k gains for the error rows (softmax sharpness)")
    ap.add_argument("--plans", action="store_true", help="first time every bf16 SDPA plan and knob variation")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, cudnn-frontend {cudnn.__version__}, cuDNN backend {backend_version()}, "
          f"{torch.cuda.get_device_name()}")
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    nvml = Nvml()
    if args.plans:
        for lk in (4425, 7945):
            try:
                plan_sweep(handle, lk, args.ms, nvml, dev)
            except Exception as e:  # noqa: BLE001 - the sweep is optional; the probe goes on
                print(f"plan sweep at lk {lk} failed: {e}")
    for lk in (2665, 4425, 6185, 7945):
        q = torch.randn(B, LQ, H, D, device=dev)
        k = torch.randn(B, lk, H, D, device=dev)
        v = torch.randn(B, lk, H, D, device=dev)
        qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
        g16 = build(handle, lk, False, cudnn.data_type.BFLOAT16)
        o16 = torch.empty(B, LQ, H, D, device=dev, dtype=torch.bfloat16)
        ws16 = torch.empty(g16.get_workspace_size(), device=dev, dtype=torch.uint8)
        pack16 = {1: qb, 2: kb, 3: vb, 4: o16}
        o8_type = None
        g8 = None
        for t in (cudnn.data_type.BFLOAT16, cudnn.data_type.HALF, cudnn.data_type.FP8_E4M3):
            try:
                g8 = build(handle, lk, True, t)
                o8_type = t
                break
            except Exception as e:  # noqa: BLE001 - report and try the next output type
                print(f"  lk {lk}: FP8 SDPA with O {t} refused: {str(e).splitlines()[0][:200]}")
        if g8 is None:
            print(f"lk {lk}: no FP8 SDPA graph")
            continue
        torch_o8 = {cudnn.data_type.BFLOAT16: torch.bfloat16, cudnn.data_type.HALF: torch.float16,
                    cudnn.data_type.FP8_E4M3: torch.float8_e4m3fn}[o8_type]
        o8 = torch.empty(B, LQ, H, D, device=dev, dtype=torch_o8)
        ws8 = torch.empty(g8.get_workspace_size(), device=dev, dtype=torch.uint8)

        def quant(x):
            s = E4M3_MAX / x.abs().max().clamp_min(1e-12)
            return (x * s).to(torch.float8_e4m3fn), (1.0 / s).reshape(1, 1, 1, 1).float()

        def pack8(qf, kf, vf, o_amax):
            """The FP8 call's tensors and O's descale; an E4M3 O is scaled to the bf16 SDPA's output amax (the
            last forward's amax in a rollout)."""
            q8, dq = quant(qf)
            k8, dk = quant(kf)
            v8, dv = quant(vf)
            one = torch.ones(1, 1, 1, 1, device=dev)
            o_descale = o_amax.clamp_min(1e-12).reshape(1, 1, 1, 1).float() / E4M3_MAX \
                if torch_o8 == torch.float8_e4m3fn else one
            return {1: q8, 2: k8, 3: v8, 4: o8, 5: dq, 6: dk, 7: dv, 8: one / E4M3_MAX, 9: one * E4M3_MAX,
                    10: 1.0 / o_descale, 11: torch.zeros(1, 1, 1, 1, device=dev),
                    12: torch.zeros(1, 1, 1, 1, device=dev)}, o_descale

        run16 = lambda: g16.execute(pack16, ws16, handle=handle)  # noqa: E731
        run16()
        p8, _ = pack8(q, k, v, o16.abs().max())
        run8 = lambda: g8.execute(p8, ws8, handle=handle)  # noqa: E731
        t16, t8, j16, j8 = [], [], [], []
        for _ in range(args.rounds):
            ms, j = sustained(run16, args.ms, nvml)
            t16.append(ms)
            j16.append(j)
            ms, j = sustained(run8, args.ms, nvml)
            t8.append(ms)
            j8.append(j)
        flops = 4 * B * LQ * lk * H * D
        m16, m8 = statistics.median(t16), statistics.median(t8)
        print(f"lk {lk}: bf16 {m16:.4f} ms ({flops / m16 / 1e9:.0f} TFLOP/s, {statistics.median(j16):.4f} J), "
              f"fp8 (O {o8_type}) {m8:.4f} ms ({flops / m8 / 1e9:.0f} TFLOP/s, {statistics.median(j8):.4f} J): "
              f"time x{m16 / m8:.2f}, energy x{statistics.median(j16) / statistics.median(j8):.2f}")
        if lk != 7945:
            continue
        for gain in (float(x) for x in args.gains.split(",")):
            qn = q / q.pow(2).mean(-1, keepdim=True).sqrt() * gain
            kn = k / k.pow(2).mean(-1, keepdim=True).sqrt() * gain
            qb2, kb2 = qn.to(torch.bfloat16), kn.to(torch.bfloat16)
            ref = reference(qb2, kb2, vb)  # the bf16 rows' exact attention: bf16 SDPA's own rounding only
            pack16.update({1: qb2, 2: kb2})
            run16()
            p8_2, o8_descale = pack8(qb2.float(), kb2.float(), vb.float(), o16.abs().max())
            g8.execute(p8_2, ws8, handle=handle)
            torch.cuda.synchronize()
            e16 = errors(o16, ref)
            e8 = errors(o8.float() * o8_descale, ref)
            # What E4M3 O costs by itself: the exact O rounded to E4M3 with one scale from its amax, and with a scale
            # per row (token and head: what the FP8 o projection's own input quantization does today).
            amax = ref.abs().max().clamp_min(1e-12) / E4M3_MAX
            eq_t = errors((ref / amax).to(torch.float8_e4m3fn).float() * amax, ref)
            row = ref.abs().amax(-1, keepdim=True).clamp_min(1e-12) / E4M3_MAX
            eq_r = errors((ref / row).to(torch.float8_e4m3fn).float() * row, ref)
            print(f"  errors at lk {lk}, q/k gain {gain:g} (logit std {gain ** 2:g}): "
                  f"bf16 SDPA rel l2 {e16[0]:.3e} max {e16[1]:.3e}; fp8 SDPA rel l2 {e8[0]:.3e} max {e8[1]:.3e}; "
                  f"exact O in E4M3: per tensor rel l2 {eq_t[0]:.3e} max {eq_t[1]:.3e}, per row rel l2 "
                  f"{eq_r[0]:.3e} max {eq_r[1]:.3e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
