#include "rollout/fingerprint.h"

#include <cstdlib>
#include <map>

#include "backend/blas_kernels.h"
#include "backend/env_settings.h"
#include "config/run_fields.h"
#include "core/error.h"
#include "core/json_text.h"
#include "core/sha256.h"
#include "core/version.h"

namespace dzr::rollout {

namespace fs = std::filesystem;

namespace {

std::string file_hash_or_null(const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec) ? sha256_file(p) : std::string();
}

/// SHA-256 of 16 blocks of 64 KiB spread evenly over a shard's data (all of it when smaller): two checkpoints
/// of one geometry have equal headers, and hashing every byte of 46 GB would take minutes.
std::string data_sample_hash(const SafetensorsFile& f) {
    constexpr uint64_t kBlock = uint64_t(64) << 10, kBlocks = 16;
    const uint8_t* data = f.mapping()->bytes_ptr() + f.data_offset();
    const uint64_t n = f.data_size();
    Sha256 h;
    if (n <= kBlock * kBlocks) {
        h.update(data, size_t(n));
    } else {
        for (uint64_t b = 0; b < kBlocks; ++b)
            h.update(data + (n - kBlock) * b / (kBlocks - 1), size_t(kBlock));
    }
    return h.hex_digest();
}

void flatten(const Json& j, const std::string& path, std::map<std::string, std::string>& out) {
    if (j.is_object()) {
        for (const auto& [k, v] : j.items()) flatten(v, path.empty() ? k : path + "." + k, out);
    } else if (j.is_array()) {
        for (size_t i = 0; i < j.size(); ++i) flatten(j[i], fmt::format("{}[{}]", path, i), out);
        if (j.empty()) out[path] = "[]";
    } else {
        out[path] = dump_json(j, -1);
    }
}

}  // namespace

Json checkpoint_identity(const Checkpoint& ckpt) {
    Json shards = Json::array();
    for (const auto& s : ckpt.shards()) {
        const auto& f = *s.file;
        shards.push_back({{"name", s.name},
                          {"bytes", f.file_size()},
                          {"header_sha256", sha256_hex(f.mapping()->bytes_ptr(), size_t(f.data_offset()))},
                          {"data_sample_sha256", data_sample_hash(f)}});
    }
    return Json{{"shards", shards},
                {"config_json_sha256", file_hash_or_null(ckpt.dir() / "config.json")},
                {"metadata_json_sha256", file_hash_or_null(ckpt.dir() / "experiment_cfg" / "metadata.json")}};
}

Json run_fingerprint(const RolloutOptions& opt, const Checkpoint& ckpt, const fs::path& tokenizer) {
    Json noise = nullptr;
    if (!opt.noise_video.empty() || !opt.noise_action.empty())
        noise = {{"video_sha256", file_hash_or_null(opt.noise_video)},
                 {"action_sha256", file_hash_or_null(opt.noise_action)}};
    // NOTE: the registry's settings that can change the numbers (config/settings.h; the geometry is the
    // checkpoint's identity). The numerics and the KV mode stay under "numerics", where earlier runs recorded them.
    Json run = config::run_settings_json(opt.run, /*numbers_only=*/true);
    run.erase("numerics");
    run["kv"].erase("mode");
    run["prompt_override"] = opt.prompt ? Json(*opt.prompt) : Json(nullptr);
    run["allow_truncate"] = opt.allow_truncate;
    run["metrics"] = {{"gt_offset", opt.metrics.gt_offset}, {"steps", opt.metrics.steps}};
    run["plots"] = bool(opt.plot_png);
    run["save_video"] = opt.save_video;
    run["noise"] = noise;
    Json env = Json::object();
    for (const auto& [name, value] : env_values_set(/*numbers_only=*/true)) env[name] = value;
    // NOTE: one device or two give the same numbers (the CFG branches split bit for bit), so only the kind counts
    const bool cuda = !opt.devices.empty() && opt.devices[0].is_cuda();
    Json numerics = {{"backend", cuda ? "cuda" : "cpu"},
                     {"compute_dtype", cuda ? "bf16" : "f32"},
                     {"mode", numerics_name(opt.run.numerics)},
                     {"kv_mode", kv_mode_name(opt.run.kv.mode)},
                     {"env", env}};
    // NOTE: the CPU backend's GEMMs round as OpenBLAS's kernel table for this CPU does (backend/blas_kernels.h)
    if (!cuda) numerics["blas_core"] = blas_core_name();
    return Json{{"dzr_version", fmt::format("{} ({})", version(), git_hash())},
                {"checkpoint", checkpoint_identity(ckpt)},
                {"tokenizer_sha256", file_hash_or_null(tokenizer)},
                {"run", run},
                {"seed", opt.run.sampling.seed},
                {"numerics", numerics}};
}

Json episode_fingerprint(const Json& run, int64_t num_frames, const std::string& prompt,
                         const std::string& inputs_sha256) {
    Json j = run;
    j["episode"] = {{"num_frames", num_frames}, {"prompt", prompt}, {"inputs_sha256", inputs_sha256}};
    return j;
}

std::string episode_inputs_sha256(const io::Episode& ep) {
    Sha256 h;
    const auto field = [&](std::string_view name, const void* data, size_t bytes) {
        const uint64_t n = bytes;
        h.update(name);
        h.update(&n, sizeof n);
        h.update(data, bytes);
    };
    for (const auto& c : ep.cameras) {
        const TensorView v = c.frames.view();
        DZR_CHECK(v.is_contiguous(), "episode {}: camera {} frames are not contiguous", ep.name, c.name);
        const std::string shape = c.name + v.shape.str();
        field(shape, v.data, size_t(v.numel()) * dtype_size(v.dtype));
    }
    for (const auto& s : ep.state) field(s.name, s.values.data(), s.values.size() * sizeof(double));
    field("actions", ep.actions.data(), ep.actions.size() * sizeof(double));
    field("fps", &ep.fps, sizeof ep.fps);
    return h.hex_digest();
}

std::vector<FieldDifference> json_differences(const Json& base, const Json& now) {
    std::map<std::string, std::string> a, b;
    flatten(base, "", a);
    flatten(now, "", b);
    std::vector<FieldDifference> out;
    for (const auto& [key, v] : a) {
        auto it = b.find(key);
        if (it == b.end())
            out.push_back({key, v, "absent"});
        else if (it->second != v)
            out.push_back({key, v, it->second});
    }
    for (const auto& [key, v] : b)
        if (!a.count(key)) out.push_back({key, "absent", v});
    return out;
}

std::vector<std::string> fingerprint_differences(const Json& recorded, const Json& now, size_t limit) {
    const std::vector<FieldDifference> all = json_differences(recorded, now);
    std::vector<std::string> out;
    for (size_t i = 0; i < all.size() && i < limit; ++i)
        out.push_back(fmt::format("{}: {} (recorded) vs {} (this run)", all[i].key, all[i].base, all[i].now));
    if (all.size() > limit) out.push_back(fmt::format("... and {} more", all.size() - limit));
    return out;
}

}  // namespace dzr::rollout
