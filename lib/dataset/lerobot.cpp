#include "dataset/lerobot.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "dataset/ffmpeg_video.h"
#include "dataset/lerobot_meta.h"
#include "dataset/parquet_table.h"
#include "io/atomic_file.h"

namespace dzr::dataset {

namespace fs = std::filesystem;

namespace {

/// One embodiment key as columns of the dataset: `column[start:end]` of a packed vector `width` wide.
struct Slice {
    std::string key, column;
    int64_t start = 0, end = 0, width = 0;
};

/// How the dataset's columns give what an episode of the layout holds.
struct Mapping {
    std::vector<std::string> video_keys;  ///< per layout camera
    std::vector<Slice> state, actions;
    bool has_actions = false;
    std::vector<std::string> language;  ///< annotation columns, in modality.json's order
    std::vector<std::string> problems;
};

const Json* modality_group(const DatasetMeta& m, const char* group) {
    if (!m.modality.is_object() || !m.modality.contains(group) || !m.modality[group].is_object()) return nullptr;
    return &m.modality[group];
}

/// The packed-vector width of feature `column` (shape [W]); 0 when it is not one.
int64_t vector_width(const DatasetMeta& m, const std::string& column) {
    if (!m.features.contains(column)) return 0;
    const Json& f = m.features[column];
    if (!f.is_object() || !f.contains("shape") || !f["shape"].is_array() || f["shape"].size() != 1 ||
        !f["shape"][0].is_number_integer())
        return 0;
    return f["shape"][0].get<int64_t>();
}

/// `group`.`key` of modality.json as a slice of its packed column (default `default_column`).
void map_slice(const DatasetMeta& m, const char* group, const std::string& key, int dim, const std::string& default_column,
               std::vector<Slice>& out, std::vector<std::string>& problems, const std::string& embodiment) {
    const std::string modality_file = (m.root / "meta" / "modality.json").string();
    const Json* g = modality_group(m, group);
    if (!g || !g->contains(key)) {
        problems.push_back(fmt::format("{}: no {}.{} (embodiment {} needs {}.{}, {} wide)", modality_file, group, key,
                                       embodiment, group, key, dim));
        return;
    }
    const Json& e = (*g)[key];
    Slice s;
    s.key = key;
    s.column = e.is_object() && e.contains("original_key") && e["original_key"].is_string()
                   ? e["original_key"].get<std::string>()
                   : default_column;
    if (!e.is_object() || !e.contains("start") || !e.contains("end") || !e["start"].is_number_integer() ||
        !e["end"].is_number_integer()) {
        problems.push_back(fmt::format("{}: {}.{} needs integer \"start\" and \"end\"", modality_file, group, key));
        return;
    }
    s.start = e["start"].get<int64_t>(), s.end = e["end"].get<int64_t>();
    s.width = vector_width(m, s.column);
    if (s.width == 0)
        problems.push_back(fmt::format("{}: no feature {} with shape [N] (for {}.{})",
                                       (m.root / "meta" / "info.json").string(), s.column, group, key));
    else if (s.start < 0 || s.end > s.width || s.end - s.start != dim)
        problems.push_back(fmt::format("{}: {}.{} is {}[{}:{}] ({} wide), but embodiment {} needs {} values",
                                       modality_file, group, key, s.column, s.start, s.end, s.end - s.start,
                                       embodiment, dim));
    else
        out.push_back(s);
}

Mapping map_columns(const DatasetMeta& m, const io::EpisodeLayout& layout) {
    Mapping map;
    const std::string info_file = (m.root / "meta" / "info.json").string();
    if (!m.modality.is_object())
        map.problems.push_back(fmt::format("{}: missing; it maps observation.state, action and the video keys to the "
                                           "embodiment's keys", (m.root / "meta" / "modality.json").string()));
    const Json* video = modality_group(m, "video");
    for (const std::string& cam : layout.cameras) {
        std::string key = "observation.images." + cam;
        if (video && video->contains(cam) && (*video)[cam].is_object() && (*video)[cam].contains("original_key"))
            key = (*video)[cam].value("original_key", key);
        map.video_keys.push_back(key);
        if (!m.features.contains(key) || m.features[key].value("dtype", "") != "video")
            map.problems.push_back(fmt::format("{}: no video feature {} (camera {} of embodiment {})", info_file, key,
                                               cam, layout.embodiment));
        else if (m.video_path.empty())
            map.problems.push_back(fmt::format("{}: no video_path template", info_file));
    }
    if (!m.modality.is_object()) return map;
    for (const auto& [key, dim] : layout.state)
        map_slice(m, "state", key, dim, "observation.state", map.state, map.problems, layout.embodiment);
    // NOTE: ground-truth actions are optional (no "action" feature: no metrics), but a dataset that has them must
    // name every action key of the embodiment
    map.has_actions = m.features.contains("action") && modality_group(m, "action");
    if (map.has_actions)
        for (const auto& [key, dim] : layout.actions)
            map_slice(m, "action", key, dim, "action", map.actions, map.problems, layout.embodiment);
    if (const Json* ann = modality_group(m, "annotation"))
        for (const auto& [key, v] : ann->items()) {
            std::string column = "annotation." + key;
            if (v.is_object() && v.contains("original_key") && v["original_key"].is_string())
                column = v["original_key"].get<std::string>();
            if (m.features.contains(column)) map.language.push_back(column);
        }
    if (m.features.contains("annotation.task")) map.language.push_back("annotation.task");
    return map;
}

/// The episode's prompt: the first language annotation that is not "not provided" (an integer column indexes the
/// tasks, a string column is the text), else the episode's first task.
std::string episode_prompt(const DatasetMeta& m, const Mapping& map, const ParquetTable& t, size_t first_row,
                           const EpisodeMeta& e, const std::string& name) {
    constexpr std::string_view kNotProvided = "not provided";
    for (const std::string& column : map.language) {
        if (!t.has(column)) continue;
        std::string text;
        try {
            text = t.strings(column)[first_row];
        } catch (const Error&) {
            const int64_t task = t.integers(column)[first_row];
            const auto it = m.tasks.find(task);
            DZR_CHECK(it != m.tasks.end(), "{}: {} {}: task index {} is not in the dataset's tasks", t.file().string(),
                      name, column, task);
            text = it->second;
        }
        if (!text.empty() && text != kNotProvided) return text;
    }
    for (const std::string& task : e.tasks)
        if (!task.empty() && task != kNotProvided) return task;
    DZR_THROW("{}: {} has no language instruction (every annotation is \"not provided\" and it lists no task); pass "
              "--prompt, or --skip-invalid to run the others", m.root.string(), name);
}

class LeRobotSource final : public io::EpisodeSource {
public:
    explicit LeRobotSource(DatasetMeta meta) : meta_(std::move(meta)) {}

    const DatasetMeta& meta() const { return meta_; }

    std::string describe() const override {
        std::string codecs;
        for (const auto& [k, f] : meta_.features.items())
            if (f.is_object() && f.value("dtype", "") == "video") {
                const std::string c = meta_.video_codec(k);
                if (!c.empty() && codecs.find(c) == std::string::npos) codecs += (codecs.empty() ? "" : ", ") + c;
            }
        return fmt::format("LeRobot {} dataset {} ({} episodes, {} fps{}{})", meta_.version, meta_.root.string(),
                           meta_.episodes.size(), meta_.fps, codecs.empty() ? "" : ", ", codecs);
    }

    std::vector<std::string> check(const io::EpisodeRef& ref, const io::EpisodeLayout& layout) const override {
        Mapping map = map_columns(meta_, layout);
        std::vector<std::string> problems = map.problems;
        const EpisodeMeta& e = episode(ref);
        // NOTE: a missing file is one line here; a directory or a device where a file belongs throws its own message
        const auto need_file = [&](const std::function<fs::path()>& path) {
            try {
                const fs::path p = path();
                if (!io::input_file_present(p)) problems.push_back(fmt::format("{}: no such file", p.string()));
            } catch (const Error& err) {
                problems.push_back(err.what());
            }
        };
        need_file([&] { return meta_.data_file(e); });
        for (const std::string& key : map.video_keys) {
            if (!meta_.features.contains(key) || meta_.video_path.empty()) continue;
            if (meta_.major >= 3 && !e.videos.count(key)) continue;
            need_file([&] { return meta_.video_file(e, key); });
        }
        return problems;
    }

    std::optional<int64_t> count_frames(const io::EpisodeRef& ref, const io::EpisodeOptions&) const override {
        return episode(ref).length;
    }

    io::Episode read(const io::EpisodeRef& ref, const io::EpisodeOptions& options) const override;

    std::vector<fs::path> inputs(const io::EpisodeRef&) const override { return {meta_.root}; }

private:
    const EpisodeMeta& episode(const io::EpisodeRef& ref) const {
        const auto it = meta_.episodes.find(ref.index);
        DZR_CHECK(it != meta_.episodes.end(), "{}: no episode {}", meta_.root.string(), ref.index);
        return it->second;
    }

    DatasetMeta meta_;
};

/// The rows of `t` that belong to episode `e` (v2: the whole file; v3: its episode_index rows, in order).
std::vector<size_t> episode_rows(const DatasetMeta& m, const ParquetTable& t, const EpisodeMeta& e, const std::string& name) {
    std::vector<size_t> rows;
    const auto index = t.integers("episode_index");
    for (size_t r = 0; r < index.size(); ++r)
        if (index[r] == e.index) rows.push_back(r);
    DZR_CHECK(int64_t(rows.size()) == e.length, "{}: {} has {} rows, but the dataset's episode table says {} frames",
              t.file().string(), name, rows.size(), e.length);
    if (m.major < 3)
        DZR_CHECK(rows.size() == index.size(), "{}: holds rows of other episodes than {}", t.file().string(), name);
    return rows;
}

io::Episode LeRobotSource::read(const io::EpisodeRef& ref, const io::EpisodeOptions& opt) const {
    const io::EpisodeLayout& layout = opt.layout;
    const Mapping map = map_columns(meta_, layout);
    if (!map.problems.empty()) {
        std::string all;
        for (const auto& p : map.problems) all += (all.empty() ? "" : "; ") + p;
        throw Error(all);
    }
    const EpisodeMeta& e = episode(ref);
    io::Episode ep;
    ep.name = ref.id;
    ep.dir = meta_.root;
    ep.embodiment = layout.embodiment;
    ep.fps = meta_.fps;

    std::vector<std::string> columns = {"episode_index", "timestamp"};
    for (const auto& s : map.state) columns.push_back(s.column);
    for (const auto& s : map.actions) columns.push_back(s.column);
    columns.insert(columns.end(), map.language.begin(), map.language.end());
    const ParquetTable t(meta_.data_file(e), columns);
    DZR_CHECK(t.has("episode_index") && t.has("timestamp"), "{}: {} needs the columns episode_index and timestamp",
              t.file().string(), ref.id);
    const std::vector<size_t> rows = episode_rows(meta_, t, e, ref.id);
    DZR_CHECK(!rows.empty(), "{}: {} has no frames", t.file().string(), ref.id);
    const int64_t T = int64_t(rows.size());
    DZR_CHECK(T >= opt.min_frames, "{}: {}: {} frames, but one call needs at least {}", meta_.root.string(), ref.id, T,
              opt.min_frames);

    if (opt.prompt) {
        io::validate_prompt(*opt.prompt, "--prompt");
        ep.prompt = *opt.prompt;
    } else {
        ep.prompt = episode_prompt(meta_, map, t, rows[0], e, ref.id);
        io::validate_prompt(ep.prompt, fmt::format("{} {}", meta_.root.string(), ref.id));
    }

    // Per-frame arrays: the modality slices of the packed columns.
    // NOTE: several keys slice one packed column: each is read once
    std::map<std::string, std::vector<double>> columns_read;
    const auto slice_rows = [&](const Slice& s) {
        auto it = columns_read.find(s.column);
        if (it == columns_read.end()) it = columns_read.emplace(s.column, t.vectors(s.column, s.width)).first;
        const std::vector<double>& packed = it->second;
        std::vector<double> out;
        out.reserve(size_t(T * (s.end - s.start)));
        for (size_t r : rows)
            for (int64_t k = s.start; k < s.end; ++k) out.push_back(packed[r * size_t(s.width) + size_t(k)]);
        return out;
    };
    for (const Slice& s : map.state)
        ep.state.push_back({s.key, int(s.end - s.start), slice_rows(s), true});
    ep.action_dim = layout.action_dim;
    if (map.has_actions) {
        std::vector<std::vector<double>> keys;
        for (const Slice& s : map.actions) keys.push_back(slice_rows(s));
        ep.actions.reserve(size_t(T * layout.action_dim));
        for (int64_t r = 0; r < T; ++r)
            for (size_t k = 0; k < keys.size(); ++k) {
                const int64_t w = map.actions[k].end - map.actions[k].start;
                ep.actions.insert(ep.actions.end(), keys[k].begin() + r * w, keys[k].begin() + (r + 1) * w);
            }
    }

    // Frames: the decoded frame nearest to each row's timestamp (v3.0: from the episode's start in the file).
    const std::vector<double> all_ts = t.numbers("timestamp");
    for (size_t c = 0; c < layout.cameras.size(); ++c) {
        const std::string& key = map.video_keys[c];
        const fs::path file = meta_.video_file(e, key);
        const double offset = meta_.major >= 3 ? e.videos.at(key).from_s : 0.0;
        std::vector<double> ts;
        ts.reserve(rows.size());
        for (size_t r : rows) ts.push_back(all_ts[r] + offset);
        for (size_t i = 1; i < ts.size(); ++i)
            DZR_CHECK(ts[i] >= ts[i - 1], "{}: {}: timestamp of frame {} ({}) is before frame {}'s ({})",
                      t.file().string(), ref.id, i, ts[i], i - 1, ts[i - 1]);
        FfmpegVideo video(file);
        io::CameraStream cam;
        cam.name = layout.cameras[c];
        cam.file = file;
        try {
            if (opt.decode_frames)
                cam.frames = video.frames_at(ts, kTimestampToleranceS);
            else
                video.check_timestamps(ts, kTimestampToleranceS);
        } catch (const Error& err) {
            DZR_THROW("{} camera {}: {}", ref.id, cam.name, err.what());
        }
        cam.file_frames = T;
        cam.fps = meta_.fps;
        cam.height = video.info().height;  // frames_at's frames are the stream's size
        cam.width = video.info().width;
        if (layout.frame_height > 0 && (cam.width != layout.frame_width || cam.height != layout.frame_height))
            ep.warnings.push_back(fmt::format("camera {} ({}): frames are {}x{}, not {}'s {}x{}; the model's "
                                              "preprocessing resizes them with padding", cam.name, key, cam.width,
                                              cam.height, layout.display_name, layout.frame_width, layout.frame_height));
        ep.cameras.push_back(std::move(cam));
    }
    ep.num_frames = T;
    if (opt.log_warnings)
        for (const auto& w : ep.warnings) log()->warn("episode {}: {}", ep.name, w);
    return ep;
}

std::vector<int64_t> select_episodes(const DatasetMeta& m, const io::DatasetSelection& selection) {
    std::vector<int64_t> all;
    for (const auto& [index, e] : m.episodes) all.push_back(index);
    std::vector<int64_t> chosen = selection.split.empty() ? all : m.split(selection.split);
    if (!selection.episodes.empty()) {
        const std::vector<int64_t> wanted = io::parse_index_ranges(selection.episodes, "--episodes");
        for (int64_t w : wanted)
            DZR_CHECK(m.episodes.count(w), "--episodes {}: {} has no episode {} (its episodes: {} of indices {}..{})",
                      selection.episodes, m.root.string(), w, m.episodes.size(), m.episodes.begin()->first,
                      m.episodes.rbegin()->first);
        std::vector<int64_t> both;
        std::set_intersection(chosen.begin(), chosen.end(), wanted.begin(), wanted.end(), std::back_inserter(both));
        chosen = both;
    }
    DZR_CHECK(!chosen.empty(), "{}: the selection ({}{}) holds no episodes", m.root.string(),
              selection.split.empty() ? "" : "--split " + selection.split + " ",
              selection.episodes.empty() ? "" : "--episodes " + selection.episodes);
    return chosen;
}

}  // namespace

std::vector<io::EpisodeRef> open_lerobot(const fs::path& root, const io::EpisodeLayout& layout,
                                         const io::DatasetSelection& selection) {
    (void)layout;  // NOTE: checked per episode (check()), so that --skip-invalid can skip what does not fit
    auto source = std::make_shared<LeRobotSource>(read_dataset_meta(root));
    log()->info("{}", source->describe());
    std::vector<io::EpisodeRef> refs;
    for (int64_t index : select_episodes(source->meta(), selection))
        refs.push_back({source, io::dataset_episode_id(index), root, index});
    return refs;
}

std::string dataset_libraries() { return fmt::format("{}, {}", arrow_version(), ffmpeg_version()); }

}  // namespace dzr::dataset
