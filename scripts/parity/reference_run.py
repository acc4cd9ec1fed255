#!/usr/bin/env python3
"""Runs the official DreamZero action head on a dzr parity input directory and dumps its stages.

The official WANPolicyHead (groot/vla/model/dreamzero/action_head/wan_flow_matching_action_tf.py, commit
ab790c1) is built at the geometry of a dzr checkpoint (its config.json), loaded from that checkpoint's
safetensors with strict key matching (the "action_head." prefix stripped; missing and unexpected keys are
reported and fail the run: a key-compatibility proof), and called once per policy call through
lazy_joint_video_action, exactly as the server does after its observation transform. Inputs come from
`dzr parity make-inputs` for any embodiment of the checkpoint: the raw camera frames, which the official eval
transform of the embodiment turns into canvases here (embodiment_ref.py: crop, resize, DreamTransform's layout;
dzr's canvas.npy is compared with them, --preprocess dzr feeds dzr's instead), the token ids and masks (the
official collate()'s template is checked against the text dzr tokenized), the raw state (normalized here per key
by the official Normalizer with the checkpoint's metadata.json statistics and conf.yaml modes) and the initial
noise (the head's generate_noise is replaced to return it, cast to the dtype it asks for).

Every stage is written as float32 into one .safetensors file under the names `dzr parity run` uses:
  c<k>.input.video         the model input in [-1, 1]: reference frame [3, H, W] on a reset, else the
                           VAE clip [3, 9, H, W]
  c<k>.state               [1, 64] normalized, padded state as the head sees it
  c<k>.text.pos / .neg     [512, dim] prompt embeddings (pad rows zeroed)
  c<k>.clip / c<k>.ys      [257, 1280] CLIP features / [20, 9, h, w] conditioning (reset calls)
  c<k>.vae.clip            [16, 3, h, w] latents of the commit clip (other calls)
  c<k>.noise.video/.action the injected noise
  c<k>.dit.<kind>.<branch>.<n>.layer_out.<l> / .head / .action_velocity
                           every DiT forward (kind prefill|commit|denoise, branch pos|neg, n-th of its kind
                           and branch in the call): each layer's output [L, dim], the head's tokens
                           [Lv, 64], the action decoder output [24, 32]
  c<k>.velocity.cond|uncond|action.<step>   the DiT outputs of an evaluated step
  c<k>.sample.video|action.<step>           what the schedulers are given at each step
  c<k>.x / c<k>.actions    the final video sample [16, 2, h, w] and action_pred [24, 32] (normalized)
  c<k>.actions_robot       [24, D] action_pred post-processed by the embodiment's keys (the official
                           Normalizer.inverse per key, relative keys + the raw state), D its action width
The file's metadata "parity" holds every forward's kind, branch, step, start frame, KV length in/out and
token count, plus the list of patches applied.

Modes: --dtype bf16 runs the head as shipped (bf16 weights and activations; needs CUDA). --dtype fp32
runs it in float32 with TF32 off; the reference hard-codes bf16 in a few places, patched as listed in
PATCHES below (and in docs/PARITY.md). --device cpu works for fp32 (slow VAE; shims listed in PATCHES).

Usage:
  python3 scripts/parity/reference_run.py --ref .ref/dreamzero --ckpt CKPT --inputs INPUTS \
      --out ref_fp32.safetensors --dtype fp32 [--device cuda] [--calls 7]
"""
import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # the UniPC helpers are torch.compile'd
HERE = Path(__file__).resolve().parent

PATCHES = {
    "fp32": [
        "HEAD.py: the module-level name `torch` is replaced by a proxy whose `bfloat16` is torch.float32, so the "
        "hard-coded bf16 casts run in fp32: encode_prompt's output cast (:545), _ensure_vae_on_device (:553), "
        "encode_image's bf16 autocast (:564; a float32 autocast casts to float32 on CUDA and disables itself on the CPU) and zero frames (:568), the "
        "video and state casts in lazy_joint_video_action (:1000-1010) and the noise dtype (:1104-1105)",
        "attention.py / wan2_1_attention.py: flash_attention (the FA2/SDPA entry of the DiT's self- and "
        "cross-attention) casts q, k, v to bf16; replaced by SDPA in the input dtype (same math: scale "
        "1/sqrt(d), no mask)",
        "torch.backends.cuda.matmul.allow_tf32 = False, torch.backends.cudnn.allow_tf32 = False, "
        "float32 matmul precision 'highest'",
    ],
    "bf16": [],
    "always": [
        "generate_noise returns the injected noise (cast to the dtype and device asked for)",
        "construction: ensure_file returns a dummy path and torch.load / nn.Module.load_state_dict are no-ops "
        "while WANPolicyHead.__init__ runs (the Wan component files are not needed: the checkpoint holds "
        "every weight); the CLIP is built with the checkpoint's stored layer count (the recipe's "
        "transformer[:N]) and, like the VAE, on the meta device before the checkpoint is loaded",
        "VideoVAE_ is built with the checkpoint's base_dim (and dim_mult / num_res_blocks / "
        "temporal_downsample)",
        "transformers.PretrainedConfig is a dummy class (transformers 5 renamed it; the head gets a "
        "namespace config)",
        "head.trt_engine = None (post_initialize, which sets it and compiles the encoders, is not run)",
    ],
    "cpu": [
        "torch.cuda.Event / torch.cuda.synchronize seen by HEAD.py are no-op stand-ins; head._device = 'cpu'",
        "device='cuda' in WanVideoVAE.__init__ (mean/std) and FlowUniPCMultistepScheduler.__init__ (sigmas) "
        "is redirected to the CPU",
    ],
}


class TorchProxy(types.ModuleType):
    """Stands in for `torch` inside one reference module: a few attributes overridden, the rest delegated."""

    def __init__(self, real, **overrides):
        super().__init__("torch")
        self.__dict__["_real"] = real
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self.__dict__["_real"], name)


class DummyEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        pass

    def elapsed_time(self, other):
        return 0.0


class DeviceRedirect:
    """What torch.from_numpy returns inside the UniPC module on a CPU run: .to(device='cuda') goes to the CPU."""

    def __init__(self, tensor, device):
        self.tensor, self.device = tensor, device

    def to(self, *args, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = self.device
        return self.tensor.to(*args, **kwargs)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref", required=True, help="checkout of the official repo (holds groot/)")
    p.add_argument("--ckpt", required=True, help="dzr checkpoint directory (config.json, safetensors)")
    p.add_argument("--inputs", required=True, help="parity input directory (dzr parity make-inputs)")
    p.add_argument("--out", required=True, help="output .safetensors")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--device", default="cuda")
    p.add_argument("--calls", type=int, default=-1, help="run only the first N calls")
    p.add_argument("--preprocess", choices=["reference", "dzr"], default="reference",
                   help="reference: the head is fed the canvases the official transform makes of the raw frames "
                        "(embodiment_ref.py; dzr's canvas.npy is compared with them and the differing pixels "
                        "reported); dzr: it is fed dzr's canvas.npy")
    p.add_argument("--no-layers", action="store_true", help="do not dump per-layer DiT outputs")
    p.add_argument("--trace-ops", metavar="FILE", help="write the aten ops (with dtypes) of the first "
                   "--trace-calls calls to FILE, one sequence per distinct module (op_trace.py)")
    p.add_argument("--trace-calls", type=int, default=2)
    p.add_argument("--vae-internals", action="store_true",
                   help="with --sub-stages: also the VAE encoder's block outputs of each encode's first chunk (large)")
    p.add_argument("--sub-stage-forwards", default="0",
                   help="with --sub-stages: the forwards (n, per kind and branch) whose internals are dumped")
    p.add_argument("--sub-stages", action="store_true",
                   help="also dump per-layer DiT internals of the first forward of each kind and branch "
                        "(patch_embed, self_attn_in, v, self_attn, cross_attn, ffn: dzr's CausalDit trace names)")
    p.add_argument("--sub-stage-set", choices=["all", "head"], default="all",
                   help="with --sub-stages: every internal (all), or only what locates a difference between the "
                        "blocks and the head at the real widths (head: the embeddings, the register tokens, the "
                        "layer outputs, the head's LayerNorm output head_norm and its Linear's input head_in)")
    return p.parse_args()


# ---- inputs ------------------------------------------------------------------------------------------

def load_state_dict_file(ckpt):
    from safetensors.torch import load_file

    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        sd = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            sd.update(load_file(str(ckpt / shard)))
        return sd
    return load_file(str(ckpt / "model.safetensors"))


# ---- the head ----------------------------------------------------------------------------------------

def import_reference(ref):
    sys.path.insert(0, str(HERE / "stubs"))
    sys.path.insert(0, str(Path(ref).resolve()))
    import transformers

    class DummyPretrainedConfig:
        def __init__(self, **kwargs):
            pass

    transformers.PretrainedConfig = DummyPretrainedConfig
    mods = types.SimpleNamespace()
    base = "groot.vla.model.dreamzero"
    import importlib

    mods.HEAD = importlib.import_module(f"{base}.action_head.wan_flow_matching_action_tf")
    mods.DIT = importlib.import_module(f"{base}.modules.wan_video_dit_action_casual_chunk")
    mods.SUB = importlib.import_module(f"{base}.modules.wan2_1_submodule")
    mods.ATTN = importlib.import_module(f"{base}.modules.wan2_1_attention")
    mods.FA = importlib.import_module(f"{base}.modules.attention")
    mods.T5 = importlib.import_module(f"{base}.modules.wan_video_text_encoder")
    mods.CLIP = importlib.import_module(f"{base}.modules.wan_video_image_encoder")
    mods.VAE = importlib.import_module(f"{base}.modules.wan_video_vae")
    mods.UNIPC = importlib.import_module(f"{base}.modules.flow_unipc_multistep_scheduler")
    return mods


def sdpa_same_dtype(q, k, v, q_lens=None, k_lens=None, dropout_p=0.0, softmax_scale=None, q_scale=None,
                    causal=False, window_size=(-1, -1), deterministic=False, dtype=None, version=None):
    """[B, L, N, D] attention in the inputs' dtype on any device (the fp32 stand-in for flash_attention)."""
    import torch

    assert q_lens is None and k_lens is None and q_scale is None and not causal and dropout_p == 0.0
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=softmax_scale)
    return out.transpose(1, 2).contiguous()


def build_head(mods, cfg, device, dtype_name):
    import torch

    hc = cfg["action_head_cfg"]["config"]
    tc, ic, vc, dc = (hc[k] for k in ("text_encoder_cfg", "image_encoder_cfg", "vae_cfg", "diffusion_model_cfg"))
    fixed_clip = dict(vision_dim=1280, vision_heads=16, vision_mlp_dim=5120, image_size=224, patch_size=14)
    for key, value in fixed_clip.items():
        if ic.get(key, value) != value:
            raise SystemExit(f"config.json: image_encoder_cfg.{key} = {ic[key]}, but the reference CLIP is a fixed "
                             f"ViT-H/14 ({key} {value})")
    if ic["use_layers"] != ic["vision_layers"] - 1:
        raise SystemExit("config.json: the reference runs all but the last stored CLIP block (use_31_block); "
                         f"use_layers {ic['use_layers']} != vision_layers {ic['vision_layers']} - 1")
    if dc.get("image_dim", 1280) != 1280:
        raise SystemExit("config.json: the reference DiT's img_emb is MLPProj(1280, dim); image_dim must be 1280")
    if vc["z_dim"] != 16:
        raise SystemExit("config.json: the reference VAE normalization constants are for z_dim 16")

    text_encoder = mods.T5.WanTextEncoder(
        vocab=tc["vocab"], dim=tc["dim"], dim_attn=tc["dim_attn"], dim_ffn=tc["dim_ffn"],
        num_heads=tc["num_heads"], num_layers=tc["num_layers"], num_buckets=tc["num_buckets"])

    real_clip = mods.CLIP.clip_xlm_roberta_vit_h_14

    def clip_factory(*args, **kwargs):
        kwargs.update(device="meta", vision_layers=ic["vision_layers"])
        return real_clip(*args, **kwargs)

    mods.CLIP.clip_xlm_roberta_vit_h_14 = clip_factory
    try:
        image_encoder = mods.CLIP.WanImageEncoder()
    finally:
        mods.CLIP.clip_xlm_roberta_vit_h_14 = real_clip

    real_vae_cls, real_vae_torch = mods.VAE.VideoVAE_, mods.VAE.torch

    def vae_factory(z_dim=16, **kwargs):
        with torch.device("meta"):
            return real_vae_cls(dim=vc["base_dim"], z_dim=z_dim, dim_mult=list(vc["dim_mult"]),
                                num_res_blocks=vc["num_res_blocks"],
                                temperal_downsample=list(vc["temporal_downsample"]))

    mods.VAE.VideoVAE_ = vae_factory
    if device.type == "cpu":
        def tensor_on_cpu(*args, device=None, **kwargs):
            return real_vae_torch.tensor(*args, device="cpu" if str(device).startswith("cuda") else device, **kwargs)

        mods.VAE.torch = TorchProxy(real_vae_torch, tensor=tensor_on_cpu)
    try:
        vae = mods.VAE.WanVideoVAE(z_dim=vc["z_dim"])
    finally:
        mods.VAE.VideoVAE_, mods.VAE.torch = real_vae_cls, real_vae_torch

    dit = mods.DIT.CausalWanModel(
        model_type=dc["model_type"], patch_size=tuple(dc["patch_size"]), frame_seqlen=dc["frame_seqlen"],
        text_len=dc["text_len"], in_dim=dc["in_dim"], dim=dc["dim"], ffn_dim=dc["ffn_dim"],
        freq_dim=dc["freq_dim"], text_dim=dc["text_dim"], out_dim=dc["out_dim"], num_heads=dc["num_heads"],
        num_layers=dc["num_layers"], max_chunk_size=dc["max_chunk_size"], eps=dc["eps"],
        num_frame_per_block=dc["num_frame_per_block"], action_dim=dc["action_dim"],
        max_state_dim=dc["max_state_dim"], hidden_size=dc["hidden_size"],
        num_action_per_block=dc["num_action_per_block"], num_state_per_block=dc["num_state_per_block"])

    config = types.SimpleNamespace(
        tiled=bool(hc.get("tiled", False)), tile_size_height=34, tile_size_width=34, tile_stride_height=18,
        tile_stride_width=16, num_frame_per_block=hc["num_frame_per_block"], hidden_size=hc["hidden_size"],
        num_frames=hc["num_frames"], text_encoder_cfg=text_encoder, image_encoder_cfg=image_encoder,
        vae_cfg=vae, diffusion_model_cfg=dit, lora_rank=4, lora_alpha=4,
        lora_target_modules="q,k,v,o,ffn.0,ffn.2", init_lora_weights="kaiming",
        train_architecture=hc.get("train_architecture", "full"), use_gradient_checkpointing=False,
        input_embedding_dim=hc.get("input_embedding_dim", 1536), action_dim=hc["action_dim"],
        action_horizon=hc["action_horizon"], num_inference_timesteps=hc.get("num_inference_timesteps"),
        skip_component_loading=True, noise_beta_alpha=1.5, noise_beta_beta=1.0, noise_s=0.999,
        video_noise_beta_alpha=3.0, video_noise_beta_beta=1.0, high_noise_beta_alpha=3.0,
        defer_lora_injection=False, tune_projector=True, tune_diffusion_model=True,
        decouple_inference_noise=bool(hc.get("decouple_inference_noise", False)), video_inference_final_noise=0.8,
        target_video_height=None, target_video_width=None)
    if config.train_architecture != "full":
        raise SystemExit(f"config.json: train_architecture {config.train_architecture!r}; only 'full' is supported")

    # Construction reads the Wan component files; the checkpoint holds every weight, so skip them.
    real_ensure, real_load, real_lsd = mods.HEAD.ensure_file, torch.load, torch.nn.Module.load_state_dict
    mods.HEAD.ensure_file = lambda path, name, repo_id=None: "unused"
    torch.load = lambda *a, **k: {}
    torch.nn.Module.load_state_dict = lambda self, *a, **k: None
    try:
        head = mods.HEAD.WANPolicyHead(config)
    finally:
        mods.HEAD.ensure_file, torch.load, torch.nn.Module.load_state_dict = real_ensure, real_load, real_lsd

    head.image_encoder.model.to_empty(device="cpu")
    head.vae.model.to_empty(device="cpu")
    return head


def load_checkpoint(head, ckpt):
    prefix = "action_head."
    raw = load_state_dict_file(ckpt)
    foreign = sorted(k for k in raw if not k.startswith(prefix))
    sd = {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)}
    missing, unexpected = head.load_state_dict(sd, strict=False)
    unexpected = sorted(set(unexpected) | {f"(no {prefix} prefix) {k}" for k in foreign})
    report = {"checkpoint_tensors": len(raw), "head_tensors": len(head.state_dict()),
              "missing": sorted(missing), "unexpected": unexpected}
    print(f"checkpoint keys: {len(raw)} in the file, {len(head.state_dict())} in the reference head; "
          f"missing {len(missing)}, unexpected {len(unexpected)}", flush=True)
    for k in sorted(missing)[:50]:
        print(f"  missing: {k}")
    for k in unexpected[:50]:
        print(f"  unexpected: {k}")
    if missing or unexpected:
        raise SystemExit("strict key matching failed: the checkpoint and the reference head differ")
    return report


# ---- recording ---------------------------------------------------------------------------------------

# --sub-stage-set head: the DiT internals kept (names without the layer index)
SUB_STAGE_HEAD_SET = {"patch_embed", "time_sin", "time_e", "time_e0", "action_tau", "action_tokens", "state_tokens",
                      "layer_out", "head_norm", "head_in"}


def install_sub_stages(rec, head):
    """Hooks dumping the per-layer internals dzr's CausalDit traces, for the first forward (n = 0) of each
    kind and branch: the DiT input after the patch embedding [Lv, C], and per block i the self-attention
    input (modulated norm) [L, C], the roped q and k and v [L, H, D], the self-attention output after o
    [L, C], the cross-attention output after o [L, C] and the FFN output before its gate [L, C]; and the time
    embedding and projection at the first row of each timestep group (time_e [G, C], time_e0 [G, 6, C])."""
    import torch

    def first():
        return rec.prefix is not None and rec.current.get("n") in rec.sub_stage_forwards

    keep = None if rec.sub_stage_set == "all" else SUB_STAGE_HEAD_SET

    def put(name, t):
        if first() and (keep is None or name.split(".")[0] in keep):
            rec.put(f"{rec.prefix}.{name}", t)

    head.model.patch_embedding.register_forward_hook(
        lambda m, a, out: put("patch_embed", out[0].flatten(1).transpose(0, 1)))
    fs = rec.frame_seqlen

    def group_rows(t):
        # dzr evaluates the time embedding once per timestep group: the video row, then (when the forward
        # carries action/state registers after the video tokens) the first register row.
        L = t.shape[1]
        lv = L - L % fs
        return t[0, [0] + ([lv] if lv < L else [])]

    head.model.time_embedding.register_forward_hook(lambda m, a, out: put("time_e", group_rows(out)))
    # the timestep sinusoid the time embedding is fed (in the activation dtype), per timestep group
    head.model.time_embedding.register_forward_pre_hook(
        lambda m, a: put("time_sin", a[0][[0] + ([int(a[0].shape[0]) - 1] if a[0].shape[0] % fs else [])]))
    # the action timestep sinusoid as the action encoder uses it (cast to the activation dtype), first row
    head.model.action_encoder.pos_encoding.register_forward_hook(
        lambda m, a, out: put("action_tau", out[0, :1].to(head.model.action_encoder.W1.W.dtype)))
    head.model.time_projection.register_forward_hook(
        lambda m, a, out: put("time_e0", group_rows(out).unflatten(-1, (6, -1))))
    for i, block in enumerate(head.model.blocks):
        nh = block.self_attn.num_heads

        def sa_in(m, args, kwargs, i=i):
            x = args[0] if args else kwargs["x"]
            put(f"self_attn_in.{i}", x[0])

        block.self_attn.register_forward_pre_hook(sa_in, with_kwargs=True)

        def qk(m, args, i=i):
            # the roped q and k as the attention call gets them; k's last Lq rows are this forward's own
            # tokens (before them: the cached history, which a denoising forward attends to)
            put(f"q.{i}", args[0][0])
            put(f"k.{i}", args[1][0][-args[0].shape[1]:])

        block.self_attn.attn.register_forward_pre_hook(qk)
        block.self_attn.v.register_forward_hook(
            lambda m, a, out, i=i, nh=nh: put(f"v.{i}", out[0].reshape(out.shape[1], nh, -1)))
        block.self_attn.o.register_forward_hook(lambda m, a, out, i=i: put(f"self_attn.{i}", out[0]))
        block.cross_attn.o.register_forward_hook(lambda m, a, out, i=i: put(f"cross_attn.{i}", out[0]))
        block.ffn.register_forward_hook(lambda m, a, out, i=i: put(f"ffn.{i}", out[0]))
        # the residual stream after the self-attention (norm3's input) and after the cross-attention (norm2's)
        block.norm3.register_forward_pre_hook(lambda m, a, i=i: put(f"x_self.{i}", a[0][0]))
        block.norm2.register_forward_pre_hook(lambda m, a, i=i: put(f"x_cross.{i}", a[0][0]))
    # the register tokens of a denoising forward: action encoder [A, C], state encoder [S, C]
    head.model.action_encoder.register_forward_hook(lambda m, a, out: put("action_tokens", out[0]))
    head.model.state_encoder.register_forward_hook(lambda m, a, out: put("state_tokens", out[0]))
    # the head (CausalHead): its LayerNorm's output [Lv, C], then its Linear's input (the modulated norm) [Lv, C]
    head.model.head.norm.register_forward_hook(lambda m, a, out: put("head_norm", out[0]))
    head.model.head.head.register_forward_pre_hook(lambda m, a: put("head_in", a[0][0]))
    if not rec.dump_layers:
        # --no-layers: the layer outputs of the selected forwards only (at the real widths every forward's would be
        # ~12 GB)
        for i, block in enumerate(head.model.blocks):
            block.register_forward_hook(lambda m, a, out, i=i: put(f"layer_out.{i}", out[0][0]))

    # The encoders' internals under dzr's trace names: umT5 per branch (the first encode of a call is the
    # prompt, the second the negative prompt), CLIP's input pixels, pre-norm and block outputs.
    def text_branch():
        return "pos" if rec.text == 0 else "neg"

    te = head.text_encoder
    te.token_embedding.register_forward_hook(lambda m, a, out: rec.put(f"umt5.{text_branch()}.embed", out[0]))
    for i, block in enumerate(te.blocks):
        block.register_forward_hook(
            lambda m, a, out, i=i: rec.put(f"umt5.{text_branch()}.layer_out.{i}", out[0]))
    # The VAE encoder's first two temporal chunks of each encode (dzr: vae.conv_in, vae.block.<i> =
    # downsamples[i] then middle[i - len(downsamples)], vae.head; the second chunk as vae.chunk1.*),
    # [C, frames, H, W]
    enc = head.vae.model.encoder

    def vae_put(name):
        # the first chunk under `name`, the second under vae.chunk1.<rest>
        second = "vae.chunk1." + name[len("vae."):]

        def hook(m, a, out):
            if f"c{rec.call}.{name}" not in rec.tensors:
                rec.put(name, out[0])
            elif f"c{rec.call}.{second}" not in rec.tensors:
                rec.put(second, out[0])
        return hook

    if rec.vae_internals:
        enc.conv1.register_forward_hook(vae_put("vae.conv_in"))
        blocks = list(enc.downsamples) + list(enc.middle)
        for i, block in enumerate(blocks):
            block.register_forward_hook(vae_put(f"vae.block.{i}"))
        enc.head.register_forward_hook(vae_put("vae.head"))
    visual = head.image_encoder.model.visual
    visual.register_forward_pre_hook(lambda m, a: rec.put("clip.pixels", a[0][0]))
    # the patch convolution's output [w, g, g] as dzr's token rows [g*g, w], and the layout of its input
    def clip_conv_in(m, a):
        x = a[0]
        print(f"clip conv input, call {rec.call}: {tuple(x.shape)} strides {x.stride()} {x.dtype} contiguous "
              f"{x.is_contiguous()} channels_last {x.is_contiguous(memory_format=torch.channels_last)}; weight "
              f"strides {m.weight.stride()}", flush=True)

    visual.patch_embedding.register_forward_pre_hook(clip_conv_in)
    visual.patch_embedding.register_forward_hook(
        lambda m, a, out: rec.put("clip.patch_embed", out[0].flatten(1).t()))
    visual.pre_norm.register_forward_hook(lambda m, a, out: rec.put("clip.pre_norm", out[0]))
    for i, block in enumerate(visual.transformer):
        block.register_forward_hook(lambda m, a, out, i=i: rec.put(f"clip.layer_out.{i}", out[0]))


class Recorder:
    def __init__(self, frame_seqlen, num_frames, dump_layers):
        self.tensors = {}
        self.forwards = []
        self.calls = []
        self.frame_seqlen, self.num_frames, self.dump_layers = frame_seqlen, num_frames, dump_layers
        self.call = -1
        self.prefix = None
        self.current = {}
        self.sub_stages = False
        self.sub_stage_forwards = {0}
        self.sub_stage_set = "all"
        self.vae_internals = False

    def new_call(self, k):
        self.call = k
        self.counts = {}
        self.text = 0
        self.video_steps = 0
        self.action_steps = 0
        self.branch = 0

    def put(self, name, t):
        import torch

        full = f"c{self.call}.{name}"
        if full in self.tensors:
            raise RuntimeError(f"stage {full} recorded twice")
        self.tensors[full] = t.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()

    def install(self, mods, head):
        rec = self

        real_encode_prompt = head.encode_prompt

        def encode_prompt(input_ids, attention_mask):
            out = real_encode_prompt(input_ids, attention_mask)
            rec.put("text.pos" if rec.text == 0 else "text.neg", out[0])
            rec.text += 1
            return out

        head.encode_prompt = encode_prompt

        real_encode_image = head.encode_image

        def encode_image(image, num_frames, height, width):
            rec.put("input.video", image[0, 0])  # [B, 1, C, H, W] -> [C, H, W]
            clip, ys, new_image = real_encode_image(image, num_frames, height, width)
            rec.put("ys", ys[0])
            return clip, ys, new_image

        head.encode_image = encode_image

        real_clip = head.image_encoder.encode_image

        def clip_encode(videos):
            out = real_clip(videos)
            rec.put("clip", out[0])
            return out

        head.image_encoder.encode_image = clip_encode

        real_vae_encode = head.vae.encode

        def vae_encode(videos, *args, **kwargs):
            out = real_vae_encode(videos, *args, **kwargs)
            if videos.shape[2] != rec.num_frames:  # the commit clip (the conditioning clip has num_frames)
                rec.put("input.video", videos[0])
                rec.put("vae.clip", out[0])
            return out

        head.vae.encode = vae_encode

        real_run = head._run_diffusion_steps

        def run_diffusion_steps(*args, **kwargs):
            rec.branch = 0
            return real_run(*args, **kwargs)

        head._run_diffusion_steps = run_diffusion_steps

        def pre_forward(module, args, kwargs):
            x = args[0] if args else kwargs["x"]
            action = kwargs.get("action")
            start = int(kwargs["current_start_frame"])
            kind = "denoise" if action is not None else ("prefill" if start == 0 else "commit")
            branch = "pos" if rec.branch == 0 else "neg"
            rec.branch += 1
            key = f"{kind}.{branch}"
            n = rec.counts.get(key, 0)
            rec.counts[key] = n + 1
            rec.prefix = f"dit.{key}.{n}"
            frames = int(x.shape[2])
            rec.current = dict(call=rec.call, kind=kind, branch=branch, n=n,
                               step=rec.video_steps if kind == "denoise" else None, start_frame=start,
                               frames=frames, kv_in=int(kwargs["kv_cache"][0].shape[2]),
                               tokens=frames * rec.frame_seqlen + (0 if action is None else
                                                                   int(action.shape[1]) + int(kwargs["state"].shape[1])))

        def post_forward(module, args, kwargs, output):
            video, action, updated = output
            rec.current["kv_out"] = int(updated[0].shape[2])
            rec.forwards.append(rec.current)
            if action is not None:
                rec.put(f"{rec.prefix}.action_velocity", action[0])
                step, branch = rec.current["step"], rec.current["branch"]
                if branch == "pos":
                    rec.put(f"velocity.cond.{step}", video[0])
                    rec.put(f"velocity.action.{step}", action[0])
                else:
                    rec.put(f"velocity.uncond.{step}", video[0])
            rec.prefix = None

        head.model.register_forward_pre_hook(pre_forward, with_kwargs=True)
        head.model.register_forward_hook(post_forward, with_kwargs=True)
        for i, block in enumerate(head.model.blocks):
            def block_hook(module, args, output, i=i):
                if rec.dump_layers:
                    rec.put(f"{rec.prefix}.layer_out.{i}", output[0][0])

            block.register_forward_hook(block_hook)
        head.model.head.register_forward_hook(lambda m, a, out: rec.put(f"{rec.prefix}.head", out[0]))
        if rec.sub_stages:
            install_sub_stages(rec, head)

        real_step = mods.UNIPC.FlowUniPCMultistepScheduler.step

        def step(sched, model_output, timestep=None, sample=None, *args, **kwargs):
            out = real_step(sched, model_output, timestep, sample, *args, **kwargs)
            if sample.dim() == 5:  # video: the head keeps [B, F, C, H, W]
                i = rec.video_steps
                rec.put(f"sample.video.{i}", sample[0].transpose(0, 1))
                rec.video_steps += 1
                if rec.video_steps == len(sched.timesteps):
                    rec.put("x", out[0][0].transpose(0, 1))
            else:
                i = rec.action_steps
                rec.put(f"sample.action.{i}", sample[0])
                rec.action_steps += 1
            return out

        mods.UNIPC.FlowUniPCMultistepScheduler.step = step


# ---- main --------------------------------------------------------------------------------------------

def main():
    args = parse_args()
    import numpy as np
    import torch
    from safetensors.numpy import save_file

    device = torch.device(args.device)
    if args.dtype == "bf16" and device.type != "cuda":
        raise SystemExit("--dtype bf16 runs the head as shipped, which needs CUDA (flash_attention asserts it)")
    ckpt, inputs = Path(args.ckpt), Path(args.inputs)
    cfg = json.loads((ckpt / "config.json").read_text())
    manifest = json.loads((inputs / "manifest.json").read_text())
    hc = cfg["action_head_cfg"]["config"]
    dc = hc["diffusion_model_cfg"]

    t0 = time.time()
    mods = import_reference(args.ref)
    applied = list(PATCHES["always"])
    compute_dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    if args.dtype == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        applied += PATCHES["fp32"]
    sys.path.insert(0, str(HERE))
    from embodiment_ref import Embodiment

    canvas_hw = tuple(manifest["canvas"])
    emb = Embodiment(args.ref, ckpt, manifest, dc["max_state_dim"], canvas_hw)
    print(emb.describe(), flush=True)
    if list(manifest["cameras"]) != emb.desc.cameras:
        raise SystemExit(f"the inputs' cameras {manifest['cameras']} are not the embodiment's {emb.desc.cameras}")
    # The instruction template of the official collate() against the text dzr tokenized.
    template = emb.prompt_text(manifest["prompt"])
    if "prompt_template_text" in manifest and template != manifest["prompt_template_text"]:
        raise SystemExit(f"prompt template differs:\n  official: {template!r}\n  dzr:      "
                         f"{manifest['prompt_template_text']!r}")
    head = build_head(mods, cfg, device, args.dtype)
    key_report = load_checkpoint(head, ckpt)
    head = head.eval().requires_grad_(False).to(device=device, dtype=compute_dtype)
    head.trt_engine = None

    head_torch = {}
    if args.dtype == "fp32":
        head_torch["bfloat16"] = torch.float32
        for m in (mods.FA, mods.ATTN, mods.SUB):
            m.flash_attention = sdpa_same_dtype
    if device.type == "cpu":
        applied += PATCHES["cpu"]
        head_torch["cuda"] = types.SimpleNamespace(Event=DummyEvent, synchronize=lambda *a, **k: None)
        head._device = "cpu"
        real_unipc_torch = mods.UNIPC.torch
        mods.UNIPC.torch = TorchProxy(real_unipc_torch,
                                      from_numpy=lambda a: DeviceRedirect(real_unipc_torch.from_numpy(a), "cpu"))
    if head_torch:
        mods.HEAD.torch = TorchProxy(torch, **head_torch)

    noise_video = torch.from_numpy(np.load(inputs / "noise_video.npy"))
    noise_action = torch.from_numpy(np.load(inputs / "noise_action.npy"))
    rec = Recorder(dc["frame_seqlen"], hc["num_frames"], not args.no_layers)
    rec.sub_stages = args.sub_stages
    rec.sub_stage_forwards = {int(n) for n in args.sub_stage_forwards.split(",")}
    rec.sub_stage_set = args.sub_stage_set
    rec.vae_internals = args.vae_internals

    def generate_noise(shape, seed=None, device=None, dtype=None):
        shape = tuple(shape)
        src = noise_video if shape == tuple(noise_video.shape) else noise_action
        if shape != tuple(src.shape):
            raise RuntimeError(f"generate_noise{shape}: the injected noise is {tuple(noise_video.shape)} "
                               f"and {tuple(noise_action.shape)}")
        out = src.to(device=head.device, dtype=dtype)
        rec.put("noise.video" if src is noise_video else "noise.action", out[0])
        return out

    head.generate_noise = generate_noise
    rec.install(mods, head)
    print(f"reference head ready in {time.time() - t0:.1f} s ({args.dtype} on {device})", flush=True)

    def ids(name):
        return torch.from_numpy(np.load(inputs / name).astype(np.int64)).reshape(1, -1).to(device)

    text = {k: ids(f"{k}.npy") for k in ("text_ids", "text_mask", "text_negative_ids", "text_negative_mask")}
    n_calls = len(manifest["calls"]) if args.calls < 0 else min(args.calls, len(manifest["calls"]))
    tracer = None
    if args.trace_ops:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from op_trace import OpTracer
        tracer = OpTracer(head)
    for k in range(n_calls):
        rec.new_call(k)
        d = inputs / f"call_{k}"
        canvas = np.load(d / "canvas.npy")  # dzr's preprocessing
        canvas_diff = None
        if args.preprocess == "reference":
            official = emb.canvas([np.load(d / f"{c}.npy") for c in emb.desc.cameras])
            if official.shape != canvas.shape:
                raise SystemExit(f"call {k}: the official canvas is {official.shape}, dzr's {canvas.shape}")
            diff = np.abs(official.astype(np.int16) - canvas.astype(np.int16))
            canvas_diff = dict(pixels=int((diff.max(axis=-1) > 0).sum()), max=int(diff.max()))
            print(f"call {k}: canvas (official transform vs dzr): {canvas_diff['pixels']} of "
                  f"{diff.shape[0] * diff.shape[1] * diff.shape[2]} pixels differ, by at most {canvas_diff['max']}",
                  flush=True)
            # NOTE: contiguous, as the official collate() makes it (torch.from_numpy(np.stack(values))): the layout
            # decides which cuDNN kernel runs CLIP's patch convolution on a multi-frame call (docs/PARITY.md)
            canvas = np.ascontiguousarray(official)
        raw = {key: np.load(d / f"{key}.npy").astype(np.float64) for key in emb.desc.state}
        state = emb.state(raw)
        # VLA.prepare_input casts floating inputs to the head's dtype (float64 -> bf16 in one rounding).
        state_t = torch.from_numpy(state).reshape(1, 1, -1).to(device=device, dtype=compute_dtype)
        rec.put("state", state_t[0])
        batch = type("Batch", (dict,), {"__getattr__": dict.__getitem__})(
            images=torch.from_numpy(canvas).unsqueeze(0).to(device), state=state_t,
            embodiment_id=torch.tensor([emb.embodiment_id], device=device), text=text["text_ids"],
            text_attention_mask=text["text_mask"], text_negative=text["text_negative_ids"],
            text_attention_mask_negative=text["text_negative_mask"])
        csf_before = head.current_start_frame
        tc = time.time()
        tracing = tracer is not None and k < args.trace_calls
        if tracing:
            tracer.new_call(k)
            tracer.__enter__()
        with torch.no_grad():
            out = head.lazy_joint_video_action(None, batch)
        if tracing:
            tracer.__exit__(None, None, None)
            if k + 1 == args.trace_calls or k + 1 == n_calls:
                tracer.remove_hooks()
                tracer.write(args.trace_ops, f"# reference {args.dtype} on {device}, torch {torch.__version__}")
                print(f"wrote the op trace {args.trace_ops}", flush=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        action = out["action_pred"][0].float()
        rec.put("actions", action)
        rec.tensors[f"c{k}.actions_robot"] = emb.robot_actions(action.cpu().numpy(), raw)
        rec.calls.append(dict(call=k, frames=int(canvas.shape[0]), start_frame_before=csf_before,
                              start_frame_after=head.current_start_frame, seconds=time.time() - tc,
                              canvas_vs_dzr=canvas_diff))
        fw = [f for f in rec.forwards if f["call"] == k]
        kinds = ", ".join(f"{f['kind']}.{f['branch']}@{f['start_frame']} kv {f['kv_in']}->{f['kv_out']}"
                          for f in fw if f["kind"] != "denoise")
        den = [f for f in fw if f["kind"] == "denoise"]
        print(f"call {k}: {canvas.shape[0]} frames, {time.time() - tc:.1f} s; {kinds}; "
              f"{len(den)} denoise forwards at start frame {den[0]['start_frame'] if den else '-'} reading kv "
              f"{den[0]['kv_in'] if den else '-'} ({den[0]['tokens'] if den else '-'} tokens); "
              f"csf {csf_before}->{head.current_start_frame}", flush=True)

    meta = dict(producer="scripts/parity/reference_run.py", dtype=args.dtype, device=str(device),
                torch=torch.__version__, ref=str(Path(args.ref).resolve()), checkpoint=str(ckpt.resolve()),
                inputs=str(inputs.resolve()), patches=applied, keys=key_report, calls=rec.calls,
                embodiment=emb.describe(), prompt_template=template,
                forwards=rec.forwards)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    save_file(rec.tensors, str(out_path), metadata={"parity": json.dumps(meta)})
    print(f"wrote {out_path}: {len(rec.tensors)} tensors from {n_calls} calls "
          f"({time.time() - t0:.1f} s in all)", flush=True)


if __name__ == "__main__":
    main()
