// `dzr parity make-inputs|run`: the dzr side of the parity harness against the official DreamZero
// implementation (docs/PARITY.md, scripts/parity/).
//
//   make-inputs  writes a parity input directory: 7 policy calls of deterministic synthetic camera
//                frames (180x320, call 0 with 1 frame, later calls with 4), the raw state, the prompt,
//                the canvases dzr's preprocessing makes of them (the reference head is fed these), the
//                umT5 token ids and masks of both CFG branches, and the initial noise drawn by dzr's
//                seeded generator (the reference's generate_noise is replaced to return it).
//   attention    runs one bf16 attention (q, k, v from .npy) through each CUDA attention implementation and
//                writes the outputs; `linear`, `conv3d` and `op` (norms, activations) do the same: the
//                kernel-level checks
//                against PyTorch (scripts/parity/kernel_probe.py).
//   run          runs DreamZeroPolicy on those inputs with the injected noise and writes the traced
//                stages of every call into one .safetensors file (f32), named as the reference
//                harness names them. With --inject-from FILE (a reference dump) the stages matching
//                --inject (default: the encoder outputs) are replaced by FILE's tensors before the
//                policy consumes them, so the DiT and sampler run on the reference's conditioning.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "apps/dzr/command.h"
#include "config/run_config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "policy/dreamzero_policy.h"
#include "policy/preprocess.h"
#include "policy/tokenizer.h"
#include "sampling/noise.h"
#include "weights/checkpoint.h"
#include "weights/safetensors.h"

#ifdef DZR_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace dzr::app {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kInputsFormat = "dzr-parity-inputs/1";
constexpr const char* kManifest = "manifest.json";
/// Camera files of a call, in the policy's naming (dreamzero-reference.md §1.2-§1.4).
constexpr const char* kCameras[3] = {"exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"};
/// Stages written by default: everything the reference harness also dumps (no per-layer internals).
constexpr const char* kDefaultDump =
    R"(^(input\.video|state|text\.(pos|neg)|clip|ys|vae\.clip|noise\.(video|action)|sample\.|velocity\.|x$|actions$))"
    R"(|^dit\..*\.(layer_out\.[0-9]+|head|action_velocity)$)";
/// Stages injected by default: every encoder output the DiT and sampler consume (umT5, CLIP, VAE).
constexpr const char* kDefaultInject = R"(^(text\.(pos|neg)|clip|ys|vae\.clip)$)";

struct MakeInputsArgs {
    std::string ckpt;
    std::string out;
    std::string tokenizer;
    std::string prompt = "Pick up the red cube and put it in the bowl";
    int calls = 7;
    uint64_t seed = kDreamZeroSeed;
};

struct RunArgs {
    std::string ckpt;
    std::string inputs;
    std::string out;
    std::string device = "cpu";
    std::string dtype;
    std::string kv = "paged";
    std::string config;
    std::string dump = kDefaultDump;
    std::string inject_from;
    std::string inject = kDefaultInject;
    int calls = -1;
    bool check_finite = false;
};

struct AttentionArgs {
    std::string q, k, v;
    std::string out;
    std::string device = "cuda";
    float scale = 0.f;  // 0: 1/sqrt(head dim)
    std::vector<std::string> impls = {"cudnn-unified", "cudnn-composite", "flash", "gemm"};
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
};

struct OpArgs {
    std::string op;
    std::string x, w, b;
    std::string out;
    std::string device = "cuda";
    float eps = 1e-6f;
};

// ---- synthetic content ------------------------------------------------------------------------------

/// The episode frame indices of call k: frame 0 for the first call, then the rollout's 4 offsets
/// [-23, -16, -8, 0] before anchor 24k (dreamzero-reference.md §1.2).
std::vector<int> call_frames(int k) {
    if (k == 0) return {0};
    const int anchor = 24 * k;
    return {anchor - 23, anchor - 16, anchor - 8, anchor};
}

/// A smooth Franka-like joint trajectory and a gripper in [0, 1].
void synth_state(int k, std::array<double, 7>& joints, double& gripper) {
    static constexpr double kRest[7] = {0.0, -0.6, 0.0, -2.2, 0.0, 1.6, 0.8};
    for (int j = 0; j < 7; ++j) joints[size_t(j)] = kRest[j] + 0.25 * std::sin(0.7 * k + 0.9 * j);
    gripper = 0.5 + 0.45 * std::sin(1.3 * k);
}

std::filesystem::path call_dir(const fs::path& root, int k) { return root / fmt::format("call_{}", k); }

fs::path tokenizer_for(const Checkpoint& ckpt, const std::string& given) {
    if (!given.empty()) return resolve_tokenizer_path(given);
    DZR_CHECK(ckpt.tokenizer_path().has_value(),
              "checkpoint {} has no umT5 tokenizer (spiece.model); give one with --tokenizer", ckpt.dir().string());
    return *ckpt.tokenizer_path();
}

void write_i64(const fs::path& p, const std::vector<int64_t>& v) {
    io::write_npy(p, io::NpyDType::I8, {int64_t(v.size())}, v.data());
}

int run_make_inputs(const MakeInputsArgs& a) {
    DZR_CHECK(a.calls >= 1, "--calls must be at least 1, got {}", a.calls);
    const Checkpoint ckpt(a.ckpt);
    const ModelConfig& m = ckpt.model_config();
    const fs::path tok_path = tokenizer_for(ckpt, a.tokenizer);
    const Umt5Tokenizer tokenizer(tok_path);
    const fs::path out(a.out);
    fs::create_directories(out);

    Json calls = Json::array();
    for (int k = 0; k < a.calls; ++k) {
        const std::vector<int> frames = call_frames(k);
        const int T = int(frames.size());
        const fs::path dir = call_dir(out, k);
        fs::create_directories(dir);
        std::vector<std::vector<uint8_t>> cams(3);
        for (int c = 0; c < 3; ++c) {
            for (int f : frames) io::append_parity_frame(c, f, kFrameHeight, kFrameWidth, cams[size_t(c)]);
            io::write_npy(dir / (std::string(kCameras[c]) + ".npy"), io::NpyDType::U1,
                          {T, kFrameHeight, kFrameWidth, 3}, cams[size_t(c)].data());
        }
        // The canvases dzr's preprocessing makes (the reference head is fed canvases).
        std::vector<uint8_t> canvas;
        const ViewSize size{m.canvas_height / 2, m.canvas_width / 2};  // as the policy does: 2 x 2 views
        for (int t = 0; t < T; ++t) {
            const auto view = [&](int c) {
                const RgbView frame{cams[size_t(c)].data() + size_t(t) * kFrameHeight * kFrameWidth * 3, kFrameHeight,
                                    kFrameWidth};
                return preprocess_view(frame, size, kCameras[c]);
            };
            const RgbImage img = compose_canvas(view(2), view(0), view(1));
            DZR_CHECK(img.height == m.canvas_height && img.width == m.canvas_width,
                      "preprocessing makes {}x{} canvases but checkpoint {} expects {}x{}", img.height, img.width,
                      a.ckpt, m.canvas_height, m.canvas_width);
            canvas.insert(canvas.end(), img.pixels.begin(), img.pixels.end());
        }
        io::write_npy(dir / "canvas.npy", io::NpyDType::U1, {T, m.canvas_height, m.canvas_width, 3}, canvas.data());
        std::array<double, 7> joints{};
        double gripper = 0;
        synth_state(k, joints, gripper);
        io::write_npy_f64(dir / "joint_position.npy", {7}, joints);
        io::write_npy_f64(dir / "gripper_position.npy", {1}, std::span<const double>(&gripper, 1));
        calls.push_back(Json{{"frames", T}, {"frame_indices", frames}});
    }

    const PromptTokens tokens = tokenize_droid_prompts(tokenizer, a.prompt, m.t5.text_len);
    write_i64(out / "text_ids.npy", tokens.positive.ids);
    write_i64(out / "text_mask.npy", tokens.positive.attention_mask);
    write_i64(out / "text_negative_ids.npy", tokens.negative.ids);
    write_i64(out / "text_negative_mask.npy", tokens.negative.attention_mask);

    // Noise of dzr's seeded generator, in the reference's shapes (batch 1).
    SeededNoise noise(a.seed);
    const int lh = m.canvas_height / 8, lw = m.canvas_width / 8;
    const Shape video{m.vae.z_dim, m.dit.num_frame_per_block, lh, lw};
    const Shape action{m.dit.num_action_per_block, m.dit.action_dim};
    std::vector<float> nv(size_t(video.numel())), na(size_t(action.numel()));
    noise.fill(NoiseKind::Video, 0, video, nv);
    noise.fill(NoiseKind::Action, 0, action, na);
    io::write_npy_f32(out / "noise_video.npy", {1, video[0], video[1], video[2], video[3]}, nv);
    io::write_npy_f32(out / "noise_action.npy", {1, action[0], action[1]}, na);

    const Json manifest{{"format", kInputsFormat},
                        {"prompt", a.prompt},
                        {"prompt_text", tokens.text},
                        {"text_len", m.t5.text_len},
                        {"text_tokens", tokens.positive.length},
                        {"negative_tokens", tokens.negative.length},
                        {"tokenizer", fs::absolute(tok_path).string()},
                        {"checkpoint", fs::absolute(a.ckpt).string()},
                        {"canvas", {m.canvas_height, m.canvas_width}},
                        {"frame_size", {kFrameHeight, kFrameWidth}},
                        {"cameras", {kCameras[0], kCameras[1], kCameras[2]}},
                        {"noise", {{"generator", noise.describe()}, {"video", video.vec()}, {"action", action.vec()}}},
                        {"calls", calls}};
    io::write_file_atomic(out / kManifest, manifest.dump(2) + "\n");
    std::printf("wrote parity inputs %s: %d calls, prompt \"%s\" (%lld + %lld tokens), canvas %dx%d, %s\n",
                out.string().c_str(), a.calls, a.prompt.c_str(), static_cast<long long>(tokens.positive.length),
                static_cast<long long>(tokens.negative.length), m.canvas_height, m.canvas_width, noise.describe().c_str());
    return 0;
}

// ---- run --------------------------------------------------------------------------------------------

/// Collects traced stages as host f32 tensors under the harness's names:
///   c<call>.<stage>                                      policy stages ("c0.text.pos", "c3.x")
///   c<call>.dit.<kind>.<branch>.<n>.<name>[.<layer>]     the n-th forward of that kind and branch in
///                                                        the call (n counts denoising steps that ran)
class StageCollector {
  public:
    StageCollector(Backend& be, const std::string& dump) : be_(be), dump_(dump) {}

    void operator()(std::string_view stage, int call, const TensorView& t) {
        if (call != call_) {
            call_ = call;
            forwards_.clear();
        }
        std::string name(stage);
        if (name.rfind("dit.", 0) == 0) {
            // "dit.<kind>.<branch>.<rest>": number the forwards; patch_embed opens each one.
            const size_t a = name.find('.', 4), b = name.find('.', a + 1);
            DZR_CHECK(a != std::string::npos && b != std::string::npos, "unexpected DiT trace name '{}'", name);
            const std::string key = name.substr(0, b), rest = name.substr(b + 1);
            if (rest == "patch_embed") ++forwards_[key];
            const int n = std::max(0, forwards_[key] - 1);
            name = fmt::format("{}.{}.{}", key, n, rest);
        }
        if (!std::regex_search(name, dump_)) return;
        if (!t.is_contiguous()) {
            log()->warn("parity: stage {} is not contiguous ({}); not dumped", name, t.str());
            return;
        }
        Tensor host = Tensor::host(t.shape, DType::F32);
        be_.download(t, host);
        const std::string full = fmt::format("c{}.{}", call, name);
        DZR_CHECK(!tensors_.count(full), "parity: stage {} traced twice", full);
        tensors_.emplace(full, std::move(host));
    }

    void add(const std::string& name, Tensor t) { tensors_[name] = std::move(t); }
    const std::map<std::string, Tensor>& tensors() const { return tensors_; }

  private:
    Backend& be_;
    std::regex dump_;
    int call_ = -1;
    std::map<std::string, int> forwards_;
    std::map<std::string, Tensor> tensors_;
};

/// Replaces the policy's tensor at every stage matching `pattern` (and every call) with the tensor
/// "c<call>.<stage>" of a dump file, converted to the compute dtype. A stage the policy computes in a
/// call but the file lacks, or a shape mismatch, is an error.
class StageInjector {
  public:
    StageInjector(Backend& be, const fs::path& file, const std::string& pattern)
        : be_(be), file_(SafetensorsFile::open(file)), pattern_(pattern) {
        try {
            re_ = std::regex(pattern);
        } catch (const std::regex_error& e) {
            DZR_THROW("--inject '{}': not a valid regex ({})", pattern, e.what());
        }
        // NOTE: a pattern that selects nothing in the file would silently turn injection off.
        int matching = 0;
        for (const auto& e : file_->entries()) {
            const size_t dot = e.name.find('.');
            if (e.name.size() > 1 && e.name[0] == 'c' && dot != std::string::npos &&
                std::regex_search(e.name.substr(dot + 1), re_))
                ++matching;
        }
        DZR_CHECK(matching > 0, "--inject-from {}: no tensor c<call>.<stage> has a stage matching --inject '{}'",
                  file.string(), pattern);
    }

    void operator()(std::string_view stage, int call, const TensorView& t) {
        const std::string s(stage);
        if (!std::regex_search(s, re_)) return;
        const std::string name = fmt::format("c{}.{}", call, s);
        const std::optional<TensorView> src = file_->find(name);
        DZR_CHECK(src.has_value(), "--inject-from {}: no tensor {}: dzr computes stage {} in call {} (--inject '{}')",
                  file_->path().string(), name, s, call, pattern_);
        DZR_CHECK(src->dtype == DType::F32 || src->dtype == DType::BF16 || src->dtype == DType::F16,
                  "--inject-from {}: tensor {} is {}, expected a float tensor", file_->path().string(), name,
                  dtype_name(src->dtype));
        DZR_CHECK(src->shape == t.shape, "--inject-from {}: stage {} of call {}: the file's tensor {} is {} but dzr's is {}",
                  file_->path().string(), s, call, name, src->shape.str(), t.shape.str());
        DZR_ASSERT(t.is_contiguous());
        be_.upload(*src, t);
        injected_.push_back(name);
    }

    const std::vector<std::string>& injected() const { return injected_; }

  private:
    Backend& be_;
    std::shared_ptr<SafetensorsFile> file_;
    std::string pattern_;
    std::regex re_;
    std::vector<std::string> injected_;
};

io::NpyArray read_checked(const fs::path& p, io::NpyDType dtype, const std::vector<int64_t>& shape) {
    io::NpyArray a = io::read_npy(p);
    DZR_CHECK(a.dtype() == dtype && a.shape() == shape, "{}: expected {} {}, found {}", p.string(),
              io::npy_dtype_name(dtype), Shape(shape).str(), a.describe());
    return a;
}

int run_parity(const RunArgs& a) {
    const fs::path in(a.inputs);
    std::ifstream mf(in / kManifest);
    DZR_CHECK(mf.good(), "{}: no {} (make one with `dzr parity make-inputs`)", in.string(), kManifest);
    Json manifest;
    try {
        manifest = Json::parse(mf);
    } catch (const std::exception& e) {
        DZR_THROW("{}: {}", (in / kManifest).string(), e.what());
    }
    DZR_CHECK(manifest.value("format", "") == kInputsFormat, "{}: format is '{}', expected '{}'",
              (in / kManifest).string(), manifest.value("format", ""), kInputsFormat);

    const Checkpoint ckpt(a.ckpt);
    const ModelConfig& m = ckpt.model_config();
    const Device device = parse_device(a.device);
    std::unique_ptr<Backend> be = make_backend(device);
    const DType dtype = be->compute_dtype();
    if (!a.dtype.empty())
        DZR_CHECK(a.dtype == dtype_name(dtype), "--dtype {}: the {} backend computes in {}", a.dtype, be->name(),
                  dtype_name(dtype));

    const std::string prompt = manifest.at("prompt").get<std::string>();
    const fs::path tok_path = manifest.at("tokenizer").get<std::string>();
    {  // the policy tokenizes the prompt itself: its ids must be the ones the reference is fed
        const Umt5Tokenizer tokenizer(tok_path);
        const PromptTokens tokens = tokenize_droid_prompts(tokenizer, prompt, m.t5.text_len);
        const auto ids = io::read_npy(in / "text_ids.npy").to_f64();
        const auto neg = io::read_npy(in / "text_negative_ids.npy").to_f64();
        DZR_CHECK(std::vector<double>(tokens.positive.ids.begin(), tokens.positive.ids.end()) == ids &&
                      std::vector<double>(tokens.negative.ids.begin(), tokens.negative.ids.end()) == neg,
                  "{}: the stored token ids differ from what tokenizer {} gives now", in.string(), tok_path.string());
    }

    config::RunConfig run_cfg;
    if (!a.config.empty()) run_cfg = config::load_run_config(a.config);
    PolicyOptions po;
    po.sampling = run_cfg.sampling;
    po.kv = run_cfg.kv;
    DZR_CHECK(a.kv == "paged" || a.kv == "dense", "--kv must be paged or dense, got '{}'", a.kv);
    po.kv_mode = a.kv == "paged" ? KvMode::Paged : KvMode::Dense;
    po.noise = load_noise_npy(in / "noise_video.npy", in / "noise_action.npy");
    // NOTE: in bf16 the reference forms [-1, 1] in bf16 (dreamzero-reference.md §1.4 step 5).
    po.unit_range = dtype == DType::BF16 ? UnitRangeMode::Bf16Reference : UnitRangeMode::F32;
    po.check_finite = a.check_finite;

    Timer load;
    DreamZeroPolicy policy(m, ckpt, ckpt.statistics(run_cfg.embodiment), tok_path, po, *be);
    StageCollector collect(*be, a.dump);
    policy.set_trace([&collect](std::string_view stage, int call, const TensorView& t) { collect(stage, call, t); });
    std::unique_ptr<StageInjector> inject;
    if (!a.inject_from.empty()) {
        inject = std::make_unique<StageInjector>(*be, a.inject_from, a.inject);
        policy.set_override([&inject](std::string_view stage, int call, const TensorView& t) { (*inject)(stage, call, t); });
    }
    std::fprintf(stderr, "dzr parity run: %s on %s, load %.1f s\n  %s\n", a.ckpt.c_str(), be->name().c_str(),
                 load.ms() / 1e3, policy.describe().c_str());

    const auto& calls = manifest.at("calls");
    const int n = a.calls < 0 ? int(calls.size()) : std::min<int>(a.calls, int(calls.size()));
    Json per_call = Json::array();
    for (int k = 0; k < n; ++k) {
        const fs::path dir = call_dir(in, k);
        const int64_t T = calls[size_t(k)].at("frames").get<int64_t>();
        std::vector<io::NpyArray> cams;
        for (const char* c : kCameras)
            cams.push_back(read_checked(dir / (std::string(c) + ".npy"), io::NpyDType::U1, {T, kFrameHeight, kFrameWidth, 3}));
        const auto joints = read_checked(dir / "joint_position.npy", io::NpyDType::F8, {7}).to_f64();
        const auto gripper = read_checked(dir / "gripper_position.npy", io::NpyDType::F8, {1}).to_f64();
        Observation obs;
        const Shape s{T, kFrameHeight, kFrameWidth, 3};
        obs.exterior_1 = TensorView(cams[0].data(), DType::U8, s);
        obs.exterior_2 = TensorView(cams[1].data(), DType::U8, s);
        obs.wrist = TensorView(cams[2].data(), DType::U8, s);
        for (int j = 0; j < 7; ++j) obs.joint_position[size_t(j)] = joints[size_t(j)];
        obs.gripper_position = gripper[0];
        obs.prompt = prompt;

        const PolicyCallResult r = policy.step(obs);
        collect.add(fmt::format("c{}.actions_robot", k), Tensor::host_f32(Shape{24, 8}, r.actions));
        per_call.push_back(Json{{"frames", T},
                                {"reset", r.reset},
                                {"reset_reason", r.reset_reason},
                                {"start_frame", r.start_frame},
                                {"kv_tokens", r.kv_tokens},
                                {"dit_evaluations", r.dit_evaluations},
                                {"total_ms", r.times.total}});
        std::fprintf(stderr, "  call %d: %lld frames, start frame %d, kv %lld%s, %.0f ms (vae %.0f, image %.0f, dit %.0f)\n",
                     k, static_cast<long long>(T), r.start_frame, static_cast<long long>(r.kv_tokens),
                     r.reset ? (", reset: " + r.reset_reason).c_str() : "", r.times.total, r.times.vae_encode,
                     r.times.image_encoder, r.times.dit);
    }

    std::vector<std::pair<std::string, TensorView>> out;
    for (const auto& [name, t] : collect.tensors()) out.emplace_back(name, t.view());
    Json meta{{"producer", "dzr parity run"},
                    {"device", device.str()},
                    {"backend", be->name()},
                    {"dtype", dtype_name(dtype)},
                    {"kv", a.kv},
                    {"checkpoint", fs::absolute(a.ckpt).string()},
                    {"inputs", fs::absolute(in).string()},
                    {"calls", per_call}};
    if (inject) {
        meta["inject_from"] = fs::absolute(a.inject_from).string();
        meta["inject"] = a.inject;
        meta["injected"] = inject->injected();
        std::fprintf(stderr, "  injected %zu tensors from %s\n", inject->injected().size(), a.inject_from.c_str());
    }
    fs::path out_path(a.out);
    if (out_path.has_parent_path()) fs::create_directories(out_path.parent_path());
    write_safetensors(out_path, out, {{"parity", meta.dump()}});
    std::printf("wrote %s: %zu tensors from %d calls\n", out_path.string().c_str(), out.size(), n);
    return 0;
}

// ---- attention ---------------------------------------------------------------------------------------

/// An operand holding bf16 values as float32 (as PyTorch writes a bf16 tensor converted to f32); anything
/// else would be rounded silently, so it is an error.
io::NpyArray read_bf16_values(const std::string& path, const char* what, int rank, const char* layout) {
    io::NpyArray a = io::read_npy(path);
    DZR_CHECK(a.dtype() == io::NpyDType::F4 && a.rank() == rank, "{}: {} must be float32 {}, got {}", path, what,
              layout, a.describe());
    const float* p = a.ptr<float>();
    for (int64_t i = 0; i < a.numel(); ++i) {
        uint32_t bits = 0;
        std::memcpy(&bits, &p[i], 4);
        DZR_CHECK((bits & 0xffffu) == 0 && std::isfinite(p[i]),
                  "{}: element {} ({}) is not a finite bf16 value; write the bf16 tensor converted to float32", path,
                  i, p[i]);
    }
    return a;
}

/// q/k/v of one attention: f32 [L, H, D] whose values are bf16 numbers (as PyTorch writes a bf16 tensor
/// converted to f32); anything else would be rounded silently, so it is an error.
io::NpyArray read_bf16_operand(const std::string& path, const char* what) {
    return read_bf16_values(path, what, 3, "[L, heads, head_dim]");
}

int run_attention(const AttentionArgs& a) {
#ifdef DZR_HAVE_CUDA
    const io::NpyArray qa = read_bf16_operand(a.q, "q"), ka = read_bf16_operand(a.k, "k"),
                       va = read_bf16_operand(a.v, "v");
    const int64_t lq = qa.dim(0), heads = qa.dim(1), d = qa.dim(2), lk = ka.dim(0), dv = va.dim(2);
    DZR_CHECK(ka.dim(1) == heads && va.dim(1) == heads && ka.dim(2) == d && va.dim(0) == lk,
              "attention: shapes disagree: q {} k {} v {}", qa.shape_str(), ka.shape_str(), va.shape_str());
    std::vector<AttentionImpl> impls;
    for (const std::string& name : a.impls) impls.push_back(parse_attention_impl(name));
    auto owned = make_cuda_backend(parse_device(a.device).index, size_t(1) << 30);
    auto* be = dynamic_cast<CudaBackend*>(owned.get());
    DZR_CHECK(be != nullptr, "parity attention needs a CUDA device (--device cuda:N)");
    const auto upload = [&](const io::NpyArray& host) {
        Tensor t = be->alloc({host.dim(0), host.dim(1), host.dim(2)}, DType::BF16);
        be->upload(host.to_tensor(), t);
        return t;
    };
    const Tensor q = upload(qa), k = upload(ka), v = upload(va);
    Tensor out = be->alloc({lq, heads, dv}, DType::BF16);
    Tensor host = Tensor::host({lq, heads, dv}, DType::F32);
    const float scale = a.scale > 0 ? a.scale : 1.f / std::sqrt(float(d));
    const fs::path dir(a.out);
    fs::create_directories(dir);
    std::printf("attention on %s: q [%lld, %lld, %lld], k/v [%lld, ...], scale %.9g\n", be->name().c_str(),
                (long long)lq, (long long)heads, (long long)d, (long long)lk, double(scale));
    for (const AttentionImpl impl : impls) {
        be->set_attention_impl(impl);
        be->fill(out, 0.f);
        be->attention({scale}, q, k, v, {}, out);
        be->download(out, host);
        const fs::path file = dir / fmt::format("o_{}.npy", attention_impl_name(impl));
        io::write_npy(file, host.view());
        std::printf("  %-16s ran %-16s -> %s\n", attention_impl_name(impl),
                    attention_impl_name(be->last_attention_impl()), file.string().c_str());
    }
    return 0;
#else
    (void)a;
    DZR_THROW("dzr parity attention needs a CUDA build (-DDZR_CUDA=ON)");
#endif
}

int run_linear(const LinearArgs& a) {
#ifdef DZR_HAVE_CUDA
    const io::NpyArray xa = read_bf16_values(a.x, "x", 2, "[M, K]"), wa = read_bf16_values(a.w, "w", 2, "[N, K]");
    std::optional<io::NpyArray> ba;
    if (!a.b.empty()) ba = read_bf16_values(a.b, "b", 1, "[N]");
    const int64_t M = xa.dim(0), K = xa.dim(1), N = wa.dim(0);
    DZR_CHECK(wa.dim(1) == K && (!ba || ba->dim(0) == N), "linear: shapes disagree: x {} w {} b {}", xa.shape_str(),
              wa.shape_str(), ba ? ba->shape_str() : "-");
    auto owned = make_cuda_backend(parse_device(a.device).index, size_t(256) << 20);
    auto* be = dynamic_cast<CudaBackend*>(owned.get());
    DZR_CHECK(be != nullptr, "parity linear needs a CUDA device (--device cuda:N)");
    const auto upload = [&](const io::NpyArray& host) {
        Tensor t = be->alloc(Shape(host.shape()), DType::BF16);
        be->upload(host.to_tensor(), t);
        return t;
    };
    const Tensor x = upload(xa), w = upload(wa);
    Tensor b;
    if (ba) b = upload(*ba);
    Tensor out = be->alloc({M, N}, DType::BF16);
    be->linear(x, w, ba ? b.view() : TensorView{}, out);
    Tensor host = Tensor::host({M, N}, DType::F32);
    be->download(out, host);
    io::write_npy(a.out, host.view());
    std::printf("linear on %s: [%lld, %lld] x [%lld, %lld]^T%s -> %s\n", be->name().c_str(), (long long)M,
                (long long)K, (long long)N, (long long)K, ba ? " + b" : "", a.out.c_str());
    return 0;
#else
    (void)a;
    DZR_THROW("dzr parity linear needs a CUDA build (-DDZR_CUDA=ON)");
#endif
}

int run_conv3d(const Conv3dArgs& a) {
#ifdef DZR_HAVE_CUDA
    const io::NpyArray xa = read_bf16_values(a.x, "x", 4, "[Ci, T, H, W]"),
                       wa = read_bf16_values(a.w, "w", 5, "[Co, Ci, kt, kh, kw]");
    std::optional<io::NpyArray> ba;
    if (!a.b.empty()) ba = read_bf16_values(a.b, "b", 1, "[Co]");
    DZR_CHECK(a.stride.size() == 3 && a.pad_before.size() == 3 && a.pad_after.size() == 3,
              "conv3d: --stride, --pad-before and --pad-after take 3 values each");
    Conv3dParams p;
    p.frames_2d = a.frames_2d;
    int64_t o[3];
    for (int i = 0; i < 3; ++i) {
        p.stride[i] = a.stride[size_t(i)], p.pad_before[i] = a.pad_before[size_t(i)];
        p.pad_after[i] = a.pad_after[size_t(i)];
        DZR_CHECK(p.stride[i] >= 1, "conv3d: strides must be >= 1");
        o[i] = (xa.dim(i + 1) + p.pad_before[i] + p.pad_after[i] - wa.dim(i + 2)) / p.stride[i] + 1;
    }
    auto owned = make_cuda_backend(parse_device(a.device).index, size_t(1) << 30);
    auto* be = dynamic_cast<CudaBackend*>(owned.get());
    DZR_CHECK(be != nullptr, "parity conv3d needs a CUDA device (--device cuda:N)");
    const auto upload = [&](const io::NpyArray& host) {
        Tensor t = be->alloc(Shape(host.shape()), DType::BF16);
        be->upload(host.to_tensor(), t);
        return t;
    };
    const Tensor x = upload(xa), w = upload(wa);
    Tensor b;
    if (ba) b = upload(*ba);
    const int64_t Co = wa.dim(0);
    Tensor out = be->alloc({Co, o[0], o[1], o[2]}, DType::BF16);
    be->conv3d(p, x, w, ba ? b.view() : TensorView{}, out);
    Tensor host = Tensor::host({Co, o[0], o[1], o[2]}, DType::F32);
    be->download(out, host);
    io::write_npy(a.out, host.view());
    std::printf("conv3d on %s: x %s w %s -> [%lld, %lld, %lld, %lld] %s\n", be->name().c_str(),
                xa.shape_str().c_str(), wa.shape_str().c_str(), (long long)Co, (long long)o[0], (long long)o[1],
                (long long)o[2], a.out.c_str());
    return 0;
#else
    (void)a;
    DZR_THROW("dzr parity conv3d needs a CUDA build (-DDZR_CUDA=ON)");
#endif
}

int run_op(const OpArgs& a) {
#ifdef DZR_HAVE_CUDA
    const io::NpyArray xa = read_bf16_values(a.x, "x", 2, "[rows, cols]");
    const int64_t cols = xa.dim(1);
    std::optional<io::NpyArray> wa, ba;
    if (!a.w.empty()) wa = read_bf16_values(a.w, "w", 1, "[cols]");
    if (!a.b.empty()) ba = read_bf16_values(a.b, "b", 1, "[cols]");
    for (const auto* p : {&wa, &ba})
        DZR_CHECK(!*p || (*p)->dim(0) == cols, "op: weight/bias {} do not match {} columns", (*p)->shape_str(), cols);
    auto owned = make_cuda_backend(parse_device(a.device).index, size_t(256) << 20);
    auto* be = dynamic_cast<CudaBackend*>(owned.get());
    DZR_CHECK(be != nullptr, "parity op needs a CUDA device (--device cuda:N)");
    const auto upload = [&](const io::NpyArray& host) {
        Tensor t = be->alloc(Shape(host.shape()), DType::BF16);
        be->upload(host.to_tensor(), t);
        return t;
    };
    const Tensor x = upload(xa);
    Tensor w, b;
    if (wa) w = upload(*wa);
    if (ba) b = upload(*ba);
    const TensorView wv = wa ? w.view() : TensorView{}, bv = ba ? b.view() : TensorView{};
    Tensor out = be->alloc(Shape(xa.shape()), DType::BF16);
    if (a.op == "layer_norm") be->layer_norm({a.eps}, x, wv, bv, out);
    else if (a.op == "rms_norm") be->rms_norm({a.eps}, x, wv, out);
    else if (a.op == "gelu_tanh") be->activation({Activation::GeluTanh}, x, out);
    else if (a.op == "gelu_erf") be->activation({Activation::GeluErf}, x, out);
    else if (a.op == "silu") be->activation({Activation::Silu}, x, out);
    else DZR_THROW("op: unknown op '{}' (layer_norm, rms_norm, gelu_tanh, gelu_erf, silu)", a.op);
    Tensor host = Tensor::host(Shape(xa.shape()), DType::F32);
    be->download(out, host);
    io::write_npy(a.out, host.view());
    std::printf("%s on %s: %s -> %s\n", a.op.c_str(), be->name().c_str(), xa.shape_str().c_str(), a.out.c_str());
    return 0;
#else
    (void)a;
    DZR_THROW("dzr parity op needs a CUDA build (-DDZR_CUDA=ON)");
#endif
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run) {
    auto* cmd = app.add_subcommand("parity", "Parity harness against the official implementation (docs/PARITY.md)");
    cmd->require_subcommand(1);

    auto mk = std::make_shared<MakeInputsArgs>();
    auto* m = cmd->add_subcommand("make-inputs", "Write a parity input directory (frames, state, canvases, tokens, noise)");
    m->add_option("--ckpt", mk->ckpt, "Checkpoint directory (geometry and tokenizer)")->required();
    m->add_option("--out", mk->out, "Directory to write")->required();
    m->add_option("--tokenizer", mk->tokenizer, "umT5 spiece.model (default: the checkpoint's)");
    m->add_option("--prompt", mk->prompt, "Instruction")->capture_default_str();
    m->add_option("--calls", mk->calls, "Number of policy calls")->capture_default_str()->check(CLI::Range(1, 64));
    m->add_option("--seed", mk->seed, "Seed of dzr's noise generator")->capture_default_str();
    m->callback([&run, mk] { run = [mk] { return run_make_inputs(*mk); }; });

    auto ra = std::make_shared<RunArgs>();
    auto* r = cmd->add_subcommand("run", "Run the policy on a parity input directory and dump the traced stages");
    r->add_option("--ckpt", ra->ckpt, "Checkpoint directory")->required();
    r->add_option("--inputs", ra->inputs, "Parity input directory (dzr parity make-inputs)")->required();
    r->add_option("--out", ra->out, "Output .safetensors file")->required();
    r->add_option("--device", ra->device, "cpu, cuda or cuda:N")->capture_default_str();
    r->add_option("--dtype", ra->dtype, "Expected compute dtype (f32 on cpu, bf16 on cuda); checked");
    r->add_option("--kv", ra->kv, "KV cache: paged or dense")->capture_default_str();
    r->add_option("--config", ra->config, "Run config for the sampling and kv settings (default: built-in)");
    r->add_option("--dump", ra->dump, "Regex of the stage names to write (searched)")->capture_default_str();
    r->add_option("--inject-from", ra->inject_from,
                  "Reference dump (.safetensors, c<call>.<stage>) whose tensors replace dzr's at the --inject stages");
    r->add_option("--inject", ra->inject, "Regex of the stage names (without c<call>.) to inject (searched)")
        ->capture_default_str();
    r->add_option("--calls", ra->calls, "Run only the first N calls (-1: all)")->capture_default_str();
    r->add_flag("--check-finite", ra->check_finite, "Check every stage for NaN/Inf");
    r->callback([&run, ra] { run = [ra] { return run_parity(*ra); }; });

    auto at = std::make_shared<AttentionArgs>();
    auto* t = cmd->add_subcommand("attention", "Run one bf16 attention from .npy operands through each CUDA implementation");
    t->add_option("--q", at->q, "float32 [Lq, heads, head_dim] holding bf16 values")->required();
    t->add_option("--k", at->k, "float32 [Lk, heads, head_dim] holding bf16 values")->required();
    t->add_option("--v", at->v, "float32 [Lk, heads, head_dim_v] holding bf16 values")->required();
    t->add_option("--out", at->out, "Directory for o_<implementation>.npy (float32 [Lq, heads, head_dim_v])")->required();
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
    auto* c = cmd->add_subcommand("conv3d", "Run one bf16 conv3d (the backend's op) from .npy operands on CUDA");
    c->add_option("--x", cv->x, "float32 [Ci, T, H, W] holding bf16 values")->required();
    c->add_option("--w", cv->w, "float32 [Co, Ci, kt, kh, kw] holding bf16 values")->required();
    c->add_option("--b", cv->b, "float32 [Co] holding bf16 values (optional)");
    c->add_option("--out", cv->out, "Output .npy (float32 [Co, To, Ho, Wo])")->required();
    c->add_option("--stride", cv->stride, "t h w")->expected(3)->capture_default_str();
    c->add_option("--pad-before", cv->pad_before, "t h w")->expected(3)->capture_default_str();
    c->add_option("--pad-after", cv->pad_after, "t h w")->expected(3)->capture_default_str();
    c->add_flag("--frames-2d", cv->frames_2d, "Run as a Conv2d over the frames (Conv3dParams::frames_2d)");
    c->add_option("--device", cv->device, "CUDA device")->capture_default_str();
    c->callback([&run, cv] { run = [cv] { return run_conv3d(*cv); }; });

    auto oa = std::make_shared<OpArgs>();
    auto* o = cmd->add_subcommand("op", "Run one bf16 row op (norm or activation) from .npy operands on CUDA");
    o->add_option("--op", oa->op, "layer_norm, rms_norm, gelu_tanh, gelu_erf or silu")->required();
    o->add_option("--x", oa->x, "float32 [rows, cols] holding bf16 values")->required();
    o->add_option("--w", oa->w, "norm weight, float32 [cols] holding bf16 values");
    o->add_option("--b", oa->b, "LayerNorm bias, float32 [cols] holding bf16 values");
    o->add_option("--eps", oa->eps, "norm epsilon")->capture_default_str();
    o->add_option("--out", oa->out, "Output .npy (float32 [rows, cols])")->required();
    o->add_option("--device", oa->device, "CUDA device")->capture_default_str();
    o->callback([&run, oa] { run = [oa] { return run_op(*oa); }; });
});

}  // namespace
}  // namespace dzr::app
