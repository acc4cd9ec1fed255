#include "weights/random_checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "config/embodiment.h"
#include "config/model_json.h"
#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "weights/checksums.h"
#include "weights/safetensors.h"

namespace dzr {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fnv1a64(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void write_text_file(const fs::path& path, const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    DZR_CHECK(f != nullptr, "cannot create {}: {}", path.string(), std::strerror(errno));
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool closed = std::fclose(f) == 0;
    DZR_CHECK(ok && closed, "cannot write {}: {}", path.string(), std::strerror(errno));
}

std::string shard_name(size_t i, size_t n) {
    return n == 1 ? std::string("model.safetensors")
                  : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
}

}  // namespace

// ---- generator ----

WeightRng::WeightRng(uint64_t seed, std::string_view key) {
    uint64_t x = seed ^ rotl(fnv1a64(key), 17);
    for (auto& s : s_) s = splitmix64(x);
}

uint64_t WeightRng::next_u64() {  // xoshiro256**
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
}

double WeightRng::uniform() {
    return double(next_u64() >> 11) * 0x1.0p-53;
}

double WeightRng::normal() {
    if (has_spare_) {
        has_spare_ = false;
        return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(kTwoPi * u2);
    has_spare_ = true;
    return r * std::cos(kTwoPi * u2);
}

void fill_random_weight(const ExpectedWeight& w, uint64_t seed, DType dtype, std::vector<uint8_t>& out) {
    DZR_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32,
              "random weights can be bf16, f16 or f32, not {}", dtype_name(dtype));
    const size_t n = size_t(w.shape.numel());
    out.resize(n * dtype_size(dtype));
    WeightRng rng(seed, w.key);
    uint8_t* p = out.data();
    const WeightInit init = w.init.resolved(w.shape);
    for (size_t i = 0; i < n; ++i) {
        float v = 0.0f;
        switch (init.kind) {
            case InitKind::Normal:
            case InitKind::FanIn:  // resolved above: Normal
                v = float(rng.normal() * init.value);
                break;
            case InitKind::OnesJitter:
                v = float(1.0 + rng.normal() * init.value);
                break;
            case InitKind::Constant:
                v = init.value;
                break;
        }
        if (dtype == DType::F32) {
            std::memcpy(p + 4 * i, &v, 4);
        } else {
            const uint16_t h = dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
            std::memcpy(p + 2 * i, &h, 2);
        }
    }
}

// ---- plan and write ----

MakePlan plan_random_checkpoint(std::vector<ExpectedWeight> weights, const MakeOptions& options) {
    DZR_CHECK(options.shard_size > 0, "shard size must be positive");
    DZR_CHECK(options.dtype == DType::BF16 || options.dtype == DType::F16 || options.dtype == DType::F32,
              "random weights can be bf16, f16 or f32, not {}", dtype_name(options.dtype));
    MakePlan plan;
    plan.weights = std::move(weights);
    plan.census = census(plan.weights);
    // NOTE: greedy split in module order, like HF's sharding: a shard closes before the tensor that would
    // push it past the limit (a single tensor larger than the limit gets a shard of its own).
    std::vector<ShardPlan> shards(1);
    for (size_t i = 0; i < plan.weights.size(); ++i) {
        const uint64_t bytes = uint64_t(plan.weights[i].shape.numel()) * dtype_size(options.dtype);
        if (!shards.back().weights.empty() && shards.back().bytes + bytes > options.shard_size)
            shards.emplace_back();
        shards.back().weights.push_back(i);
        shards.back().bytes += bytes;
        plan.total_bytes += bytes;
    }
    for (size_t i = 0; i < shards.size(); ++i) shards[i].name = shard_name(i, shards.size());
    plan.shards = std::move(shards);
    return plan;
}

MakePlan write_random_checkpoint(const ModelConfig& config, std::vector<ExpectedWeight> weights,
                                 const MakeOptions& options,
                                 const fs::path& out_dir) {
    MakePlan plan = plan_random_checkpoint(std::move(weights), options);
    check_outlier_options(plan.weights, options.outliers);
    std::error_code ec;
    if (fs::exists(out_dir, ec)) {
        DZR_CHECK(fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec),
                  "output {} already exists and is not an empty directory", out_dir.string());
    }
    const fs::path abs = fs::absolute(out_dir).lexically_normal();
    const fs::path name = abs.has_filename() ? abs.filename() : abs.parent_path().filename();
    const fs::path parent = abs.has_filename() ? abs.parent_path() : abs.parent_path().parent_path();
    DZR_CHECK(fs::is_directory(parent, ec), "cannot write {}: the parent directory {} does not exist",
              out_dir.string(), parent.string());
    const fs::path tmp = parent / fmt::format(".{}.tmp-{}", name.string(), ::getpid());
    fs::remove_all(tmp, ec);
    DZR_CHECK(fs::create_directories(tmp / "experiment_cfg", ec), "cannot create {}: {}", tmp.string(),
              ec.message());
    try {
        json dzr_info = {{"generator", "dzr ckpt make"},
                         {"seed", options.seed},
                         {"dtype", std::string(dtype_name(options.dtype))}};
        if (options.outliers.enabled())
            dzr_info["outlier_columns"] = {{"columns", options.outliers.columns},
                                           {"scale", options.outliers.scale},
                                           {"weights", "the Linear weights --precision fp8 quantizes"}};
        write_text_file(tmp / "config.json", config::model_config_to_json(config, dzr_info).dump(2) + "\n");
        write_text_file(tmp / "experiment_cfg" / "metadata.json",
                        options.metadata_json.empty() ? droid_metadata_json() : options.metadata_json);
        if (!options.conf_yaml.empty()) write_text_file(tmp / "experiment_cfg" / "conf.yaml", options.conf_yaml);
        if (!options.tokenizer.empty()) {
            fs::copy_file(options.tokenizer, tmp / "spiece.model", ec);
            DZR_CHECK(!ec, "cannot copy the tokenizer {}: {}", options.tokenizer.string(), ec.message());
        }

        json weight_map = json::object();
        for (const auto& shard : plan.shards)
            for (size_t wi : shard.weights) weight_map[plan.weights[wi].key] = shard.name;
        // NOTE: every tensor has its own generator (seeded from the key), so the shards are independent and the
        // bytes do not depend on the thread count.
        const size_t threads = options.threads > 0 ? size_t(options.threads) : worker_threads(plan.shards.size());
        parallel_for(plan.shards.size(), threads, [&](size_t s) {
            const ShardPlan& shard = plan.shards[s];
            std::vector<SafetensorsTensorSpec> specs;
            specs.reserve(shard.weights.size());
            for (size_t wi : shard.weights) specs.push_back({plan.weights[wi].key, options.dtype, plan.weights[wi].shape});
            write_safetensors(
                tmp / shard.name, specs, {{"format", "pt"}}, [&](size_t i, std::vector<uint8_t>& out) {
                    const ExpectedWeight& w = plan.weights[shard.weights[i]];
                    fill_random_weight(w, options.seed, options.dtype, out);
                    apply_outlier_columns(w, options.seed, options.outliers, options.dtype, out);
                });
        });
        std::vector<std::string> files = {"config.json", "experiment_cfg/metadata.json"};
        for (const auto& shard : plan.shards) files.push_back(shard.name);
        if (plan.indexed()) {
            json index = {{"metadata", {{"total_size", plan.total_bytes}}}, {"weight_map", weight_map}};
            write_text_file(tmp / "model.safetensors.index.json", index.dump(2) + "\n");
            files.push_back("model.safetensors.index.json");
        }
        if (!options.tokenizer.empty()) files.push_back("spiece.model");
        write_checksums(tmp, files);
        fs::rename(tmp, abs, ec);
        DZR_CHECK(!ec, "cannot rename {} to {}: {}", tmp.string(), abs.string(), ec.message());
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
    return plan;
}

std::string droid_metadata_json() {
    // Quantiles over plausible DROID (Franka Panda) data; min/max a little wider, mean the midpoint,
    // std a quarter of the q01..q99 range.
    const auto stats = [](const std::vector<double>& q01, const std::vector<double>& q99) {
        return synthetic_statistics_json(q01, q99);
    };
    json state = {
        {"joint_position", stats({-1.05, -0.55, -0.95, -2.65, -1.10, 0.75, -1.35},
                                 {1.05, 1.25, 0.95, -0.75, 1.10, 3.35, 1.45})},
        {"gripper_position", stats({0.0}, {0.99})},
        {"cartesian_position",
         stats({0.25, -0.45, 0.05, -3.1, -0.6, -1.6}, {0.75, 0.45, 0.75, 3.1, 0.6, 1.6})},
    };
    json action = {
        {"joint_position", stats(std::vector<double>(7, -0.5), std::vector<double>(7, 0.5))},  // relative
        {"gripper_position", stats({0.0}, {1.0})},
        {"cartesian_position", stats({-0.1, -0.1, -0.1, -0.3, -0.3, -0.3}, {0.1, 0.1, 0.1, 0.3, 0.3, 0.3})},
    };
    json video = json::object();
    for (const char* cam : {"exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"})
        video[cam] = {{"resolution", {320, 180}}, {"channels", 3}, {"fps", 15.0}};
    auto modality = [](int dim, bool absolute = true) {
        return json{{"absolute", absolute}, {"continuous", true}, {"shape", {dim}}};
    };
    json modalities = {
        {"video", video},
        {"state",
         {{"cartesian_position", modality(6)},
          {"gripper_position", modality(1)},
          {"joint_position", modality(7)}}},
        {"action",
         {{"cartesian_position", modality(6, false)},
          {"gripper_position", modality(1)},
          {"joint_position", modality(7, false)}}},
    };
    json root = {{"oxe_droid",
                  {{"statistics", {{"state", state}, {"action", action}}},
                   {"modalities", modalities},
                   {"embodiment_tag", "oxe_droid"}}}};
    return root.dump(2) + "\n";
}

std::optional<std::string> random_weights_note(const json& config_json) {
    const auto dzr = config_json.find("dzr");
    if (dzr == config_json.end() || !dzr->is_object()) return std::nullopt;
    const auto gen = dzr->find("generator");
    if (gen == dzr->end() || !gen->is_string() || gen->get<std::string>() != "dzr ckpt make") return std::nullopt;
    const auto seed = dzr->find("seed");
    return seed != dzr->end() && seed->is_number_integer()
               ? fmt::format("random weights (dzr ckpt make, seed {})", seed->get<int64_t>())
               : std::string("random weights (dzr ckpt make)");
}

}  // namespace dzr
