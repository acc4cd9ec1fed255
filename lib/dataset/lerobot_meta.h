#pragma once
/// A LeRobot dataset's meta/ files, parsed (lerobot.h reads episodes with them).
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dzr::dataset {

using Json = nlohmann::json;

/// Where one camera's frames of an episode lie in a v3.0 video file.
struct VideoSpan {
    int64_t chunk = 0, file = 0;
    double from_s = 0, to_s = 0;
};

struct EpisodeMeta {
    int64_t index = 0;
    int64_t length = 0;
    std::vector<std::string> tasks;
    // v3.0: the data file and the episode's rows in it (global `index` range), and each camera's span.
    int64_t data_chunk = 0, data_file = 0;
    int64_t from_index = 0, to_index = 0;
    std::map<std::string, VideoSpan> videos;
};

struct DatasetMeta {
    std::filesystem::path root;
    std::string version;  ///< "v2.0", "v2.1", "v3.0"
    int major = 2;
    double fps = 0;
    int64_t chunks_size = 1000;
    std::string data_path, video_path;  ///< info.json's templates
    Json features;                      ///< info.json "features"
    Json modality;                      ///< meta/modality.json (null when absent)
    Json splits;                        ///< info.json "splits" (null when absent)
    std::map<int64_t, std::string> tasks;
    std::map<int64_t, EpisodeMeta> episodes;

    /// The data parquet and the camera's mp4 of an episode (the templates filled in).
    std::filesystem::path data_file(const EpisodeMeta& e) const;
    std::filesystem::path video_file(const EpisodeMeta& e, const std::string& video_key) const;
    /// The feature's codec ("h264", "av1"; "" when info.json does not say).
    std::string video_codec(const std::string& video_key) const;
    /// The episode indices of info.json's split `name` ("0:100" ranges).
    std::vector<int64_t> split(const std::string& name) const;
};

/// Reads meta/info.json, the episode and task tables and meta/modality.json of `root`.
DatasetMeta read_dataset_meta(const std::filesystem::path& root);

/// Fills a LeRobot path template ("data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"): the
/// fields `{name}` and `{name:0Nd}`; an unknown field is an error naming `what`.
std::string fill_template(const std::string& pattern, const std::map<std::string, std::string>& text_fields,
                          const std::map<std::string, int64_t>& number_fields, const std::string& what);

}  // namespace dzr::dataset
