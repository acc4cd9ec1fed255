#include "dataset/lerobot_meta.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_text.h"
#include "dataset/parquet_table.h"
#include "io/atomic_file.h"

namespace dzr::dataset {

namespace fs = std::filesystem;

namespace {

Json parse_json_file_text(const std::string& text, const std::string& source) {
    try {
        return parse_json_strict<Json>(text, source);
    } catch (const Json::exception& e) {
        DZR_THROW("{}: not valid JSON: {}", source, e.what());
    }
}

Json read_json(const fs::path& file) {
    DZR_CHECK(io::input_file_present(file), "{}: no such file", file.string());
    return parse_json_file_text(io::read_file(file), file.string());
}

/// j[key] as a T, or an error naming the file and the key.
template <typename T>
T field(const Json& j, const char* key, const std::string& source) {
    const auto it = j.find(key);
    DZR_CHECK(it != j.end(), "{}: no \"{}\"", source, key);
    try {
        return it->template get<T>();
    } catch (const Json::exception&) {
        DZR_THROW("{}: \"{}\" has the wrong type ({})", source, key, it->type_name());
    }
}

/// Every line of a .jsonl file as an object; blank lines skipped.
std::vector<Json> read_jsonl(const fs::path& file) {
    DZR_CHECK(io::input_file_present(file), "{}: no such file", file.string());
    const std::string text = io::read_file(file);
    std::vector<Json> out;
    size_t pos = 0;
    for (int line = 1; pos < text.size(); ++line) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        const std::string row = text.substr(pos, end - pos);
        pos = end + 1;
        if (row.find_first_not_of(" \t\r") == std::string::npos) continue;
        Json j = parse_json_file_text(row, fmt::format("{}: line {}", file.string(), line));
        DZR_CHECK(j.is_object(), "{}: line {}: expected an object", file.string(), line);
        out.push_back(std::move(j));
    }
    return out;
}

void read_v2_tables(DatasetMeta& m) {
    const fs::path tasks_file = m.root / "meta" / "tasks.jsonl";
    for (const Json& j : read_jsonl(tasks_file)) {
        const std::string src = tasks_file.string();
        m.tasks[field<int64_t>(j, "task_index", src)] = field<std::string>(j, "task", src);
    }
    const fs::path episodes_file = m.root / "meta" / "episodes.jsonl";
    for (const Json& j : read_jsonl(episodes_file)) {
        const std::string src = episodes_file.string();
        EpisodeMeta e;
        e.index = field<int64_t>(j, "episode_index", src);
        e.length = field<int64_t>(j, "length", src);
        if (j.contains("tasks")) e.tasks = field<std::vector<std::string>>(j, "tasks", src);
        DZR_CHECK(e.index >= 0 && e.length >= 0, "{}: episode {} has a negative index or length", src, e.index);
        DZR_CHECK(m.episodes.emplace(e.index, e).second, "{}: episode {} is listed twice", src, e.index);
    }
}

std::vector<std::string> video_keys(const DatasetMeta& m) {
    std::vector<std::string> keys;
    for (const auto& [k, f] : m.features.items())
        if (f.is_object() && f.value("dtype", "") == "video") keys.push_back(k);
    return keys;
}

std::vector<fs::path> parquet_files_under(const fs::path& dir) {
    std::vector<fs::path> out;
    std::error_code ec;
    DZR_CHECK(fs::is_directory(dir, ec), "{}: no such directory (a v3.0 dataset keeps its episode table there)",
              dir.string());
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
        if (it->path().extension() == ".parquet") out.push_back(it->path());
    std::sort(out.begin(), out.end());
    DZR_CHECK(!out.empty(), "{}: no .parquet files (a v3.0 dataset keeps its episode table there)", dir.string());
    return out;
}

void read_v3_tables(DatasetMeta& m) {
    const ParquetTable tasks(m.root / "meta" / "tasks.parquet", {});
    // NOTE: LeRobot writes the task strings as the pandas index, stored as a column named "task"
    const std::string task_column = tasks.has("task") ? "task" : "__index_level_0__";
    DZR_CHECK(tasks.has(task_column) && tasks.has("task_index"), "{}: expected the columns task and task_index",
              tasks.file().string());
    const auto names = tasks.strings(task_column);
    const auto ids = tasks.integers("task_index");
    for (size_t i = 0; i < ids.size(); ++i) m.tasks[ids[i]] = names[i];

    const std::vector<std::string> keys = video_keys(m);
    for (const fs::path& file : parquet_files_under(m.root / "meta" / "episodes")) {
        const ParquetTable t(file, {});
        std::vector<std::string> need = {"episode_index", "length", "data/chunk_index", "data/file_index",
                                         "dataset_from_index", "dataset_to_index"};
        for (const auto& k : keys)
            for (const char* f : {"chunk_index", "file_index", "from_timestamp", "to_timestamp"})
                need.push_back(fmt::format("videos/{}/{}", k, f));
        for (const auto& c : need) DZR_CHECK(t.has(c), "{}: no column {}", file.string(), c);
        const auto index = t.integers("episode_index"), length = t.integers("length");
        const auto chunk = t.integers("data/chunk_index"), dfile = t.integers("data/file_index");
        const auto from = t.integers("dataset_from_index"), to = t.integers("dataset_to_index");
        const auto tasks_of = t.has("tasks") ? t.string_lists("tasks") : std::vector<std::vector<std::string>>();
        std::map<std::string, std::vector<double>> vfrom, vto;
        std::map<std::string, std::vector<int64_t>> vchunk, vfile;
        for (const auto& k : keys) {
            vchunk[k] = t.integers(fmt::format("videos/{}/chunk_index", k));
            vfile[k] = t.integers(fmt::format("videos/{}/file_index", k));
            vfrom[k] = t.numbers(fmt::format("videos/{}/from_timestamp", k));
            vto[k] = t.numbers(fmt::format("videos/{}/to_timestamp", k));
        }
        for (size_t r = 0; r < index.size(); ++r) {
            EpisodeMeta e;
            e.index = index[r], e.length = length[r];
            e.data_chunk = chunk[r], e.data_file = dfile[r], e.from_index = from[r], e.to_index = to[r];
            if (!tasks_of.empty()) e.tasks = tasks_of[r];
            for (const auto& k : keys) e.videos[k] = {vchunk[k][r], vfile[k][r], vfrom[k][r], vto[k][r]};
            DZR_CHECK(e.index >= 0 && e.length >= 0 && e.to_index - e.from_index == e.length,
                      "{}: episode {}: length {} does not match dataset_from_index {} .. dataset_to_index {}",
                      file.string(), e.index, e.length, e.from_index, e.to_index);
            DZR_CHECK(m.episodes.emplace(e.index, e).second, "{}: episode {} is listed twice", file.string(), e.index);
        }
    }
}

}  // namespace

std::string fill_template(const std::string& pattern, const std::map<std::string, std::string>& text_fields,
                          const std::map<std::string, int64_t>& number_fields, const std::string& what) {
    std::string out;
    size_t pos = 0;
    while (pos < pattern.size()) {
        const size_t open = pattern.find('{', pos);
        if (open == std::string::npos) {
            out += pattern.substr(pos);
            break;
        }
        out += pattern.substr(pos, open - pos);
        const size_t close = pattern.find('}', open);
        DZR_CHECK(close != std::string::npos, "{} \"{}\": unclosed '{{'", what, pattern);
        const std::string spec = pattern.substr(open + 1, close - open - 1);
        const size_t colon = spec.find(':');
        const std::string name = spec.substr(0, colon);
        const std::string format = colon == std::string::npos ? "" : spec.substr(colon + 1);
        if (const auto t = text_fields.find(name); t != text_fields.end() && format.empty()) {
            out += t->second;
        } else if (const auto n = number_fields.find(name); n != number_fields.end()) {
            int width = 0;
            const bool plain = format.empty();
            const bool padded = format.size() >= 3 && format.front() == '0' && format.back() == 'd' &&
                                std::from_chars(format.data() + 1, format.data() + format.size() - 1, width).ec ==
                                    std::errc() && width <= 20;
            DZR_CHECK(plain || padded, "{} \"{}\": unsupported format {{{}}}", what, pattern, spec);
            out += fmt::format("{:0{}d}", n->second, width);
        } else {
            DZR_THROW("{} \"{}\": unknown field {{{}}}", what, pattern, spec);
        }
        pos = close + 1;
    }
    return out;
}

fs::path DatasetMeta::data_file(const EpisodeMeta& e) const {
    if (major >= 3)
        return root / fill_template(data_path, {}, {{"chunk_index", e.data_chunk}, {"file_index", e.data_file}},
                                    (root / "meta" / "info.json").string() + " data_path");
    return root / fill_template(data_path, {}, {{"episode_chunk", e.index / chunks_size}, {"episode_index", e.index}},
                                (root / "meta" / "info.json").string() + " data_path");
}

fs::path DatasetMeta::video_file(const EpisodeMeta& e, const std::string& key) const {
    if (major >= 3) {
        const VideoSpan& v = e.videos.at(key);
        return root / fill_template(video_path, {{"video_key", key}}, {{"chunk_index", v.chunk}, {"file_index", v.file}},
                                    (root / "meta" / "info.json").string() + " video_path");
    }
    return root / fill_template(video_path, {{"video_key", key}},
                                {{"episode_chunk", e.index / chunks_size}, {"episode_index", e.index}},
                                (root / "meta" / "info.json").string() + " video_path");
}

std::string DatasetMeta::video_codec(const std::string& key) const {
    const Json& f = features.at(key);
    for (const char* info : {"info", "video_info"})
        if (f.contains(info) && f[info].is_object() && f[info].contains("video.codec") && f[info]["video.codec"].is_string())
            return f[info]["video.codec"].get<std::string>();
    return "";
}

std::vector<int64_t> DatasetMeta::split(const std::string& name) const {
    const std::string src = (root / "meta" / "info.json").string();
    DZR_CHECK(splits.is_object() && splits.contains(name), "{}: no split \"{}\"{}", src, name,
              splits.is_object() ? fmt::format(" (it has: {})", [&] {
                  std::string s;
                  for (const auto& [k, v] : splits.items()) s += (s.empty() ? "" : ", ") + k;
                  return s;
              }()) : std::string(" (it lists no splits)"));
    const Json& v = splits[name];
    DZR_CHECK(v.is_string(), "{}: split \"{}\" is not a \"start:end\" string", src, name);
    const std::string range = v.get<std::string>();
    const size_t colon = range.find(':');
    int64_t a = -1, b = -1;
    const bool ok = colon != std::string::npos &&
                    std::from_chars(range.data(), range.data() + colon, a).ec == std::errc() &&
                    std::from_chars(range.data() + colon + 1, range.data() + range.size(), b).ec == std::errc() &&
                    a >= 0 && a <= b;
    DZR_CHECK(ok, "{}: split \"{}\" is \"{}\", expected \"start:end\"", src, name, range);
    std::vector<int64_t> out;
    for (const auto& [index, e] : episodes)
        if (index >= a && index < b) out.push_back(index);
    return out;
}

DatasetMeta read_dataset_meta(const fs::path& root) {
    DatasetMeta m;
    m.root = root;
    const fs::path info_file = root / "meta" / "info.json";
    const std::string src = info_file.string();
    const Json info = read_json(info_file);
    DZR_CHECK(info.is_object(), "{}: expected an object", src);
    m.version = field<std::string>(info, "codebase_version", src);
    DZR_CHECK(m.version == "v2.0" || m.version == "v2.1" || m.version == "v3.0",
              "{}: codebase_version {} is not one dzr reads (v2.0, v2.1, v3.0)", src, m.version);
    m.major = m.version == "v3.0" ? 3 : 2;
    m.fps = field<double>(info, "fps", src);
    DZR_CHECK(std::isfinite(m.fps) && m.fps > 0 && m.fps <= 1000, "{}: fps {} is not a frame rate", src, m.fps);
    if (info.contains("chunks_size")) m.chunks_size = field<int64_t>(info, "chunks_size", src);
    DZR_CHECK(m.chunks_size > 0, "{}: chunks_size must be positive", src);
    m.data_path = field<std::string>(info, "data_path", src);
    if (info.contains("video_path") && !info["video_path"].is_null())
        m.video_path = field<std::string>(info, "video_path", src);
    m.features = field<Json>(info, "features", src);
    DZR_CHECK(m.features.is_object(), "{}: \"features\" must be an object", src);
    if (info.contains("splits")) m.splits = info["splits"];

    if (m.major >= 3)
        read_v3_tables(m);
    else
        read_v2_tables(m);
    DZR_CHECK(!m.episodes.empty(), "{}: the dataset lists no episodes", (root / "meta").string());

    const fs::path modality_file = root / "meta" / "modality.json";
    if (io::input_file_present(modality_file)) {
        m.modality = read_json(modality_file);
        DZR_CHECK(m.modality.is_object(), "{}: expected an object", modality_file.string());
    }
    return m;
}

}  // namespace dzr::dataset
