// `dzr parity make-inputs|run`: the dzr side of the parity harness against the official DreamZero
// implementation (docs/PARITY.md, scripts/parity/).
//
//   make-inputs  writes a parity input directory for one embodiment of the checkpoint (--embodiment): 7 policy
//                calls of deterministic synthetic frames per camera (at the embodiment's recorded size, DROID's
//                180x320; call 0 with 1 frame, later calls with 4), the raw state per key, the prompt and its
//                template text, the canvases dzr's preprocessing makes of them, the umT5 token ids and masks of
//                both CFG branches, and the initial noise drawn by dzr's seeded generator (the reference's
//                generate_noise is replaced to return it).
//   attention, linear, conv3d, op: one bf16 op on .npy operands through the CUDA backend (parity_kernels.cpp).
//   run          runs DreamZeroPolicy on those inputs with the injected noise (in the --numerics mode asked
//                for) and writes the traced stages of every call into one .safetensors file (f32), named as
//                the reference harness names them. With --inject-from FILE (a reference dump) the stages
//                matching --inject (default: the encoder outputs) are replaced by FILE's tensors before the
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
#include "apps/dzr/diag/parity_kernels.h"
#include "config/embodiment.h"
#include "config/run_config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "policy/dreamzero_policy.h"
#include "policy/preprocess.h"
#include "policy/prompt.h"
#include "policy/tokenizer.h"
#include "rollout/noise_files.h"
#include "weights/checkpoint.h"
#include "weights/safetensors.h"

namespace dzr::app {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kInputsFormat = "dzr-parity-inputs/1";
constexpr const char* kManifest = "manifest.json";
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
    std::string embodiment;
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
    std::string numerics = "reference";
    std::string precision;  // empty: the config's (bf16 without one)
    std::string kv_dtype;   // empty: the config's kv.dtype
    std::string config;
    std::string dump = kDefaultDump;
    std::string inject_from;
    std::string inject = kDefaultInject;
    int calls = -1;
    bool check_finite = false;
};

// ---- synthetic content ------------------------------------------------------------------------------

/// The episode frame indices of call k: frame 0 for the first call, then the rollout's 4 offsets
/// [-23, -16, -8, 0] before anchor 24k (dreamzero-reference.md §1.2).
std::vector<int> call_frames(int k) {
    if (k == 0) return {0};
    const int anchor = 24 * k;
    return {anchor - 23, anchor - 16, anchor - 8, anchor};
}

/// The raw state of call k, the embodiment's keys concatenated. DROID: a smooth Franka-like joint trajectory
/// and a gripper in [0, 1]; other embodiments: every element moves smoothly inside its key's q01..q99
/// range (so that normalization, padding and the relative actions are exercised with values that matter).
std::vector<double> synth_state(int k, const Embodiment& e) {
    std::vector<double> s;
    if (e.tag == "oxe_droid") {
        static constexpr double kRest[7] = {0.0, -0.6, 0.0, -2.2, 0.0, 1.6, 0.8};
        for (int j = 0; j < 7; ++j) s.push_back(kRest[j] + 0.25 * std::sin(0.7 * k + 0.9 * j));
        s.push_back(0.5 + 0.45 * std::sin(1.3 * k));
        return s;
    }
    for (const auto& key : e.state)
        for (int i = 0; i < key.dim; ++i) {
            const double lo = key.stats.q01.empty() ? -1.0 : key.stats.q01[size_t(i)];
            const double hi = key.stats.q99.empty() ? 1.0 : key.stats.q99[size_t(i)];
            const double u = 0.5 + 0.45 * std::sin(0.7 * k + 0.9 * double(key.offset + i));
            s.push_back(lo + (hi - lo) * u);
        }
    return s;
}

/// The checkpoint's embodiment `tag` (empty: its only one).
Embodiment embodiment_of(const Checkpoint& ckpt, const std::string& tag) {
    return select_embodiment(load_checkpoint_embodiments(ckpt.dir()), tag, ckpt.model_config());
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
    const Embodiment e = embodiment_of(ckpt, a.embodiment);
    const CanvasSpec spec = canvas_spec(e, m);
    const fs::path tok_path = tokenizer_for(ckpt, a.tokenizer);
    const Umt5Tokenizer tokenizer(tok_path);
    const fs::path out(a.out);
    fs::create_directories(out);
    // Frames at each camera's recorded size (DROID's when the embodiment leaves it open).
    const int fh = e.cameras[0].height > 0 ? e.cameras[0].height : kFrameHeight;
    const int fw = e.cameras[0].width > 0 ? e.cameras[0].width : kFrameWidth;
    const size_t nc = e.cameras.size();

    Json calls = Json::array();
    for (int k = 0; k < a.calls; ++k) {
        const std::vector<int> frames = call_frames(k);
        const int T = int(frames.size());
        const fs::path dir = call_dir(out, k);
        fs::create_directories(dir);
        std::vector<std::vector<uint8_t>> cams(nc);
        for (size_t c = 0; c < nc; ++c) {
            for (int f : frames) io::append_parity_frame(int(c), f, fh, fw, cams[c]);
            io::write_npy(dir / (e.cameras[c].key + ".npy"), io::NpyDType::U1, {T, fh, fw, 3}, cams[c].data());
        }
        // The canvases dzr's preprocessing makes (the reference head is fed canvases).
        std::vector<uint8_t> canvas;
        for (int t = 0; t < T; ++t) {
            std::vector<RgbImage> views;
            for (size_t c = 0; c < nc; ++c) {
                const RgbView frame{cams[c].data() + size_t(t) * size_t(fh) * size_t(fw) * 3, fh, fw};
                views.push_back(preprocess_view(frame, spec, e.cameras[c].key));
            }
            const RgbImage img = compose_canvas(spec.layout, views);
            DZR_CHECK(img.height == m.canvas_height && img.width == m.canvas_width,
                      "preprocessing makes {}x{} canvases but checkpoint {} expects {}x{}", img.height, img.width,
                      a.ckpt, m.canvas_height, m.canvas_width);
            canvas.insert(canvas.end(), img.pixels.begin(), img.pixels.end());
        }
        io::write_npy(dir / "canvas.npy", io::NpyDType::U1, {T, m.canvas_height, m.canvas_width, 3}, canvas.data());
        // The raw state, one file per key (DROID: joint_position [7], gripper_position [1]).
        const std::vector<double> state = synth_state(k, e);
        for (const auto& key : e.state)
            io::write_npy_f64(dir / (key.key + ".npy"), {key.dim},
                              std::span<const double>(state.data() + key.offset, size_t(key.dim)));
        calls.push_back(Json{{"frames", T}, {"frame_indices", frames}});
    }

    const PromptTokens tokens = tokenize_prompts(tokenizer, *e.prompt, a.prompt, m.t5.text_len);
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

    Json cameras = Json::array(), state_keys = Json::array(), action_keys = Json::array();
    for (const auto& c : e.cameras) cameras.push_back(c.key);
    for (const auto& k : e.state) state_keys.push_back(Json{{"key", k.key}, {"dim", k.dim}, {"norm", norm_mode_name(k.norm)}});
    for (const auto& k : e.action)
        action_keys.push_back(Json{{"key", k.key}, {"dim", k.dim}, {"norm", norm_mode_name(k.norm)}, {"relative", k.relative}});
    const Json manifest{{"format", kInputsFormat},
                        {"embodiment", e.tag},
                        {"embodiment_source", e.source},
                        {"projector_index", e.projector_index},
                        {"canvas_layout", canvas_layout_name(e.layout)},
                        {"state_keys", state_keys},
                        {"action_keys", action_keys},
                        {"prompt", a.prompt},
                        {"prompt_template_text", templated_prompt(*e.prompt, a.prompt)},
                        {"prompt_text", tokens.text},
                        {"text_len", m.t5.text_len},
                        {"text_tokens", tokens.positive.length},
                        {"negative_tokens", tokens.negative.length},
                        {"tokenizer", fs::absolute(tok_path).string()},
                        {"checkpoint", fs::absolute(a.ckpt).string()},
                        {"canvas", {m.canvas_height, m.canvas_width}},
                        {"frame_size", {fh, fw}},
                        {"cameras", cameras},
                        {"noise", {{"generator", noise.describe()}, {"video", video.vec()}, {"action", action.vec()}}},
                        {"calls", calls}};
    io::write_file_atomic(out / kManifest, manifest.dump(2) + "\n");
    std::printf("wrote parity inputs %s: embodiment %s, %d calls, prompt \"%s\" (%lld + %lld tokens), canvas %dx%d, %s\n",
                out.string().c_str(), e.tag.c_str(), a.calls, a.prompt.c_str(), static_cast<long long>(tokens.positive.length),
                static_cast<long long>(tokens.negative.length), m.canvas_height, m.canvas_width, noise.describe().c_str());
    return 0;
}

// ---- run --------------------------------------------------------------------------------------------

/// Whether the --dump regex takes any of the DiT's intermediates that only a per-branch forward traces (the
/// embeddings' and the layers'; the patch embedding, the head's and the action velocity a batched forward traces too):
/// searched in the collector's names of each forward kind.
bool dumps_dit_layers(const std::string& dump) {
    const std::regex re(dump);
    for (const char* kind : {"prefill", "commit", "denoise"})
        for (const char* name : {"action_tokens", "state_tokens", "time_sin", "action_tau", "time_e", "time_e0",
                                 "self_attn_in.0", "q.0", "k.0", "v.0", "self_attn.0", "x_self.0", "cross_attn.0",
                                 "x_cross.0", "ffn.0", "layer_out.0"})
            if (std::regex_search(fmt::format("dit.{}.pos.0.{}", kind, name), re)) return true;
    return false;
}

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
    // NOTE: the documented environment overrides apply, so device_round.sh can run variants of the same inputs
    BackendOptions options = apply_env_overrides({});
    options.numerics = parse_numerics(a.numerics);
    std::unique_ptr<Backend> be = make_backend(device, options);
    const DType dtype = be->compute_dtype();
    if (!a.dtype.empty())
        DZR_CHECK(a.dtype == dtype_name(dtype), "--dtype {}: the {} backend computes in {}", a.dtype, be->name(),
                  dtype_name(dtype));

    const std::string prompt = manifest.at("prompt").get<std::string>();
    const fs::path tok_path = manifest.at("tokenizer").get<std::string>();
    // NOTE: inputs made before embodiments were recorded are DROID's.
    const Embodiment e = embodiment_of(ckpt, manifest.value("embodiment", std::string("oxe_droid")));
    {  // the policy tokenizes the prompt itself: its ids must be the ones the reference is fed
        const Umt5Tokenizer tokenizer(tok_path);
        const PromptTokens tokens = tokenize_prompts(tokenizer, *e.prompt, prompt, m.t5.text_len);
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
    po.precision = run_cfg.precision;
    // NOTE: as `dzr rollout` takes them (the FP8 gates, docs/PARITY.md); the engine checks FP8 support and paged KV
    if (!a.precision.empty()) po.precision = parse_precision(a.precision, "--precision");
    if (!a.kv_dtype.empty()) po.kv.dtype = parse_precision(a.kv_dtype, "--kv-dtype");
    DZR_CHECK(a.kv == "paged" || a.kv == "dense", "--kv must be paged or dense, got '{}'", a.kv);
    po.kv.mode = a.kv == "paged" ? KvMode::Paged : KvMode::Dense;
    po.noise = load_noise_npy(in / "noise_video.npy", in / "noise_action.npy");
    // NOTE: in bf16 the reference forms [-1, 1] in bf16 (dreamzero-reference.md §1.4 step 5).
    po.unit_range = dtype == DType::BF16 ? UnitRangeMode::Bf16Reference : UnitRangeMode::F32;
    po.check_finite = a.check_finite;
    // NOTE: a dump without the DiT's layer intermediates lets fast numerics batch the CFG branches, as a rollout does
    po.trace_dit_layers = dumps_dit_layers(a.dump);

    Timer load;
    DreamZeroPolicy policy(m, ckpt, e, tok_path, po, *be);
    StageCollector collect(*be, a.dump);
    policy.set_trace([&collect](std::string_view stage, int call, const TensorView& t) { collect(stage, call, t); });
    std::unique_ptr<StageInjector> inject;
    if (!a.inject_from.empty()) {
        inject = std::make_unique<StageInjector>(*be, a.inject_from, a.inject);
        policy.set_override([&inject](std::string_view stage, int call, const TensorView& t) { (*inject)(stage, call, t); });
    }
    std::fprintf(stderr, "dzr parity run: %s on %s (%s numerics), load %.1f s\n  %s\n", a.ckpt.c_str(),
                 be->name().c_str(), numerics_name(be->numerics()), load.ms() / 1e3,
                 policy.describe().c_str());

    const auto& calls = manifest.at("calls");
    const int n = a.calls < 0 ? int(calls.size()) : std::min<int>(a.calls, int(calls.size()));
    Json per_call = Json::array();
    for (int k = 0; k < n; ++k) {
        const fs::path dir = call_dir(in, k);
        const int64_t T = calls[size_t(k)].at("frames").get<int64_t>();
        const std::vector<int64_t> fs_ = manifest.at("frame_size").get<std::vector<int64_t>>();
        DZR_CHECK(fs_.size() == 2, "{}: frame_size must be [height, width]", (in / kManifest).string());
        std::vector<io::NpyArray> cams;
        Observation obs;
        for (const auto& c : e.cameras) {
            cams.push_back(read_checked(dir / (c.key + ".npy"), io::NpyDType::U1, {T, fs_[0], fs_[1], 3}));
            obs.views.emplace_back(cams.back().data(), DType::U8, Shape{T, fs_[0], fs_[1], 3});
        }
        for (const auto& key : e.state) {
            const auto v = read_checked(dir / (key.key + ".npy"), io::NpyDType::F8, {key.dim}).to_f64();
            obs.state.insert(obs.state.end(), v.begin(), v.end());
        }
        obs.prompt = prompt;

        const PolicyCallResult r = policy.step(obs);
        collect.add(fmt::format("c{}.actions_robot", k),
                    Tensor::host_f32(Shape{int64_t(m.dit.num_action_per_block), int64_t(e.action_dim())}, r.actions));
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
                    {"numerics", numerics_name(be->numerics())},
                    {"precision", precision_name(po.precision)},
                    {"kv_dtype", precision_name(po.kv.dtype)},
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

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run) {
    auto* cmd = app.add_subcommand("parity", "Parity harness against the official implementation (docs/PARITY.md)");
    cmd->require_subcommand(1);

    auto mk = std::make_shared<MakeInputsArgs>();
    auto* m = cmd->add_subcommand("make-inputs", "Write a parity input directory (frames, state, canvases, tokens, noise)");
    m->add_option("--ckpt", mk->ckpt, "Checkpoint directory (geometry and tokenizer)")->required();
    m->add_option("--out", mk->out, "Directory to write")->required();
    m->add_option("--tokenizer", mk->tokenizer, "umT5 spiece.model (default: the checkpoint's)");
    m->add_option("--prompt", mk->prompt, "Instruction")->capture_default_str();
    m->add_option("--embodiment", mk->embodiment, "The checkpoint's embodiment (default: its only one)");
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
    r->add_option("--numerics", ra->numerics, "reference or fast (docs/PARITY.md: the gate of fast)")
        ->capture_default_str();
    r->add_option("--precision", ra->precision,
                  "DiT Linear weights: bf16 or fp8 (E4M3, per-output-channel scales; default: the config's, else bf16)");
    r->add_option("--kv-dtype", ra->kv_dtype, "KV pool and cross caches: bf16 or fp8 (E4M3, a scale per token and head; default: the "
                                              "config's kv.dtype, else bf16)");
    r->add_option("--config", ra->config, "Run config for the sampling and kv settings (default: built-in)");
    r->add_option("--dump", ra->dump, "Regex of the stage names to write (searched)")->capture_default_str();
    r->add_option("--inject-from", ra->inject_from,
                  "Reference dump (.safetensors, c<call>.<stage>) whose tensors replace dzr's at the --inject stages");
    r->add_option("--inject", ra->inject, "Regex of the stage names (without c<call>.) to inject (searched)")
        ->capture_default_str();
    r->add_option("--calls", ra->calls, "Run only the first N calls (-1: all)")->capture_default_str();
    r->add_flag("--check-finite", ra->check_finite, "Check every stage for NaN/Inf");
    r->callback([&run, ra] { run = [ra] { return run_parity(*ra); }; });

    add_parity_kernel_commands(*cmd, run);
});

}  // namespace
}  // namespace dzr::app
