#include "weights/checkpoint.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "config/model_json.h"
#include "core/error.h"
#include "core/json_text.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "weights/keys.h"

namespace dzr {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";


json parse_json(const std::string& text, const std::string& source) {
    try {
        return parse_json_strict<json>(text, source);
    } catch (const json::exception& e) {
        DZR_THROW("{}: not valid JSON: {}", source, e.what());
    }
}

bool is_plain_file_name(const std::string& name) {
    return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

/// Finds `tokenizer_path: ...` anywhere in experiment_cfg/conf.yaml (the training run's setting).
std::optional<std::string> conf_tokenizer_path(const YAML::Node& n, int depth = 0) {
    if (depth > 16) return std::nullopt;
    if (n.IsMap()) {
        for (auto it = n.begin(); it != n.end(); ++it) {
            if (it->first.IsScalar() && it->first.Scalar() == "tokenizer_path" && it->second.IsScalar())
                return it->second.Scalar();
            if (auto r = conf_tokenizer_path(it->second, depth + 1)) return r;
        }
    } else if (n.IsSequence()) {
        for (const auto& c : n)
            if (auto r = conf_tokenizer_path(c, depth + 1)) return r;
    }
    return std::nullopt;
}

std::optional<fs::path> tokenizer_in(const fs::path& p) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
    if (fs::is_directory(p, ec)) {
        for (const char* rel : {"spiece.model", "tokenizer/spiece.model"}) {
            const fs::path c = p / rel;
            if (fs::is_regular_file(c, ec)) return c;
        }
    }
    return std::nullopt;
}

}  // namespace

// ---- keys ----

std::string normalize_peft_key(const std::string& key) {
    const std::string_view infix = keys::kPeftBaseLayer;
    std::string out;
    out.reserve(key.size());
    size_t start = 0;
    for (size_t p; (p = key.find(infix, start)) != std::string::npos; start = p + infix.size()) {
        out.append(key, start, p - start);
        out.push_back('.');
    }
    out.append(key, start, std::string::npos);
    return out;
}

fs::path resolve_tokenizer_path(const fs::path& given) {
    if (auto p = tokenizer_in(given)) return *p;
    DZR_THROW(
        "tokenizer {}: not found (expected a spiece.model file, or a directory with spiece.model or "
        "tokenizer/spiece.model)",
        given.string());
}

// ---- Checkpoint ----

Checkpoint::Checkpoint(const fs::path& dir) : dir_(dir) {
    std::error_code ec;
    DZR_CHECK(fs::is_directory(dir_, ec), "checkpoint directory {} does not exist", dir_.string());
    load_config();
    open_shards();
    load_metadata();
    find_tokenizer();
}

void Checkpoint::load_config() {
    const fs::path p = dir_ / "config.json";
    DZR_CHECK(io::input_file_present(p), "{}: config.json is missing (the checkpoint's model geometry)",
              dir_.string());
    config_json_ = parse_json(io::read_file(p), p.string());
    auto r = config::model_config_from_json(config_json_, p.string());
    model_config_ = r.model;
    defaulted_ = std::move(r.defaulted);
}

void Checkpoint::open_shards() {
    const fs::path index_path = dir_ / kIndexName;
    // NOTE: an entry of that name that is not a file (a directory, a FIFO) is named as such, not "missing"
    if (io::input_file_present(index_path)) {
        has_index_ = true;
        const std::string src = index_path.string();
        const json index = parse_json(io::read_file(index_path), src);
        DZR_CHECK(index.is_object(), "{}: expected a JSON object", src);
        if (index.contains("metadata")) {
            const json& md = index["metadata"];
            DZR_CHECK(md.is_object(), "{}: metadata must be an object", src);
            if (md.contains("total_size")) {
                DZR_CHECK(md["total_size"].is_number_unsigned(),
                          "{}: metadata.total_size must be a byte count", src);
                declared_total_size_ = md["total_size"].get<uint64_t>();
            }
        }
        DZR_CHECK(index.contains("weight_map") && index["weight_map"].is_object(),
                  "{}: weight_map must be an object of tensor -> shard file", src);
        std::map<std::string, std::vector<std::string>> by_shard;  // shard -> keys the index puts there
        for (const auto& [key, shard] : index["weight_map"].items()) {
            DZR_CHECK(shard.is_string(), "{}: weight_map[{}] must be a shard file name, got {}", src, key,
                      shard.dump());
            const std::string name = shard.get<std::string>();
            DZR_CHECK(is_plain_file_name(name),
                      "{}: weight_map[{}] = '{}' is not a file name in the directory", src, key, name);
            by_shard[name].push_back(key);
        }
        DZR_CHECK(!by_shard.empty(), "{}: weight_map is empty", src);
        for (const auto& [name, listed] : by_shard) {
            const fs::path sp = dir_ / name;
            DZR_CHECK(io::input_file_present(sp),
                      "{}: shard {} is missing (the index puts {} tensors there, e.g. {})", dir_.string(),
                      name, listed.size(), listed.front());
            shards_.push_back({name, SafetensorsFile::open(sp)});
            const auto& file = *shards_.back().file;
            std::set<std::string> listed_set(listed.begin(), listed.end());
            for (const auto& key : listed)
                DZR_CHECK(file.contains(key), "{}: tensor {} is listed in {} but absent from the shard",
                          sp.string(), key, kIndexName);
            for (const auto& e : file.entries())
                DZR_CHECK(listed_set.count(e.name), "{}: tensor {} is in the shard but {} does not list it",
                          sp.string(), e.name, kIndexName);
        }
    } else {
        const fs::path single = dir_ / kSingleName;
        DZR_CHECK(io::input_file_present(single), "{}: no {} and no {} (no weights)", dir_.string(),
                  kIndexName, kSingleName);
        shards_.push_back({kSingleName, SafetensorsFile::open(single)});
    }
    for (size_t i = 0; i < shards_.size(); ++i) index_shard(i);
    if (declared_total_size_ && *declared_total_size_ != tensor_bytes())
        log()->warn("{}: metadata.total_size is {} but the shards hold {} bytes of tensors",
                    index_path.string(), *declared_total_size_, tensor_bytes());
}

void Checkpoint::index_shard(size_t shard_index) {
    const auto& shard = shards_[shard_index];
    for (const auto& e : shard.file->entries()) {
        const std::string key = normalize_peft_key(e.name);
        auto [it, inserted] = keys_.emplace(key, Location{shard_index, e.name});
        if (!inserted) {
            const auto& other = it->second;
            DZR_THROW("{}: tensor {} in {} and tensor {} in {} are the same weight {}", dir_.string(),
                      other.stored, shards_[other.shard].name, e.name, shard.name, key);
        }
    }
}

void Checkpoint::load_metadata() {
    const fs::path p = dir_ / "experiment_cfg" / "metadata.json";
    std::error_code ec;
    if (!fs::exists(p, ec)) return;
    statistics_ = parse_metadata_json(io::read_file(p), p.string());
}

void Checkpoint::find_tokenizer() {
    if ((tokenizer_path_ = tokenizer_in(dir_))) return;
    const fs::path conf = dir_ / "experiment_cfg" / "conf.yaml";
    std::error_code ec;
    if (!fs::is_regular_file(conf, ec)) return;
    try {
        if (auto t = conf_tokenizer_path(YAML::LoadFile(conf.string()))) {
            fs::path p(*t);
            if (p.is_relative()) p = dir_ / p;
            tokenizer_path_ = tokenizer_in(p);
        }
    } catch (const YAML::Exception& e) {
        // NOTE: conf.yaml only hints at a tokenizer; a file we cannot parse must not block loading.
        log()->debug("{}: not readable as YAML ({}); ignoring it for the tokenizer path", conf.string(),
                     e.what());
    }
}

std::optional<TensorView> Checkpoint::find(const std::string& key) const {
    auto it = keys_.find(key);
    if (it == keys_.end()) return std::nullopt;
    return shards_[it->second.shard].file->find(it->second.stored);
}

std::vector<std::string> Checkpoint::keys() const {
    std::vector<std::string> out;
    out.reserve(keys_.size());
    for (const auto& [k, loc] : keys_) out.push_back(k);
    return out;
}

std::string Checkpoint::location(const std::string& key) const {
    const CheckpointShard* s = shard_of(key);
    return s ? s->name : dir_.string();
}

std::optional<StoredRange> Checkpoint::stored_range(const std::string& key) const {
    auto it = keys_.find(key);
    if (it == keys_.end()) return std::nullopt;
    const SafetensorsFile& file = *shards_[it->second.shard].file;
    const SafetensorsEntry* e = file.entry(it->second.stored);
    if (!e) return std::nullopt;
    return StoredRange{file.path(), file.data_offset() + e->begin};
}

uint64_t Checkpoint::tensor_bytes() const {
    uint64_t n = 0;
    for (const auto& s : shards_)
        for (const auto& e : s.file->entries()) n += e.nbytes();
    return n;
}

const std::string& Checkpoint::stored_key(const std::string& key) const {
    auto it = keys_.find(key);
    DZR_CHECK(it != keys_.end(), "{}: no tensor {}", dir_.string(), key);
    return it->second.stored;
}

const SafetensorsEntry* Checkpoint::entry(const std::string& key) const {
    auto it = keys_.find(key);
    if (it == keys_.end()) return nullptr;
    return shards_[it->second.shard].file->entry(it->second.stored);
}

const CheckpointShard* Checkpoint::shard_of(const std::string& key) const {
    auto it = keys_.find(key);
    return it == keys_.end() ? nullptr : &shards_[it->second.shard];
}

Tensor Checkpoint::tensor(const std::string& key) const {
    auto it = keys_.find(key);
    DZR_CHECK(it != keys_.end(), "{}: no tensor {}", dir_.string(), key);
    return shards_[it->second.shard].file->tensor(it->second.stored);
}

const EmbodimentStatistics& Checkpoint::statistics(const std::string& embodiment) const {
    DZR_CHECK(!statistics_.empty(), "{}: experiment_cfg/metadata.json is missing (normalization statistics)",
              dir_.string());
    auto it = statistics_.find(embodiment);
    if (it == statistics_.end()) {
        std::string have;
        for (const auto& [k, v] : statistics_) have += (have.empty() ? "" : ", ") + k;
        DZR_THROW("{}: experiment_cfg/metadata.json has no embodiment {} (it has: {})", dir_.string(),
                  embodiment, have);
    }
    return it->second;
}

}  // namespace dzr
