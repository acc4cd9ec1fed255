#pragma once
/// LeRobot datasets as an episode source (io/episode_source.h), read where they lie: v2.0 and v2.1 (one parquet
/// and one mp4 per camera per episode, meta/episodes.jsonl and meta/tasks.jsonl) and v3.0 (many episodes per
/// parquet and per mp4, meta/episodes/*.parquet and meta/tasks.parquet). meta/modality.json maps the packed
/// observation.state / action vectors and the video keys to the embodiment's keys. docs/FORMATS.md describes the
/// layouts. Nothing is ever written into a dataset.
#include <filesystem>
#include <vector>

#include "io/episode_source.h"

namespace dzr::dataset {

/// A frame is the decoded frame nearest to the parquet's timestamp, and must lie this close (LeRobot's
/// tolerance_s).
inline constexpr double kTimestampToleranceS = 1e-4;

/// Opens the LeRobot dataset at `root` (its meta/ files only) and lists the selected episodes in episode_index
/// order. Throws dzr::Error naming the file for a missing or malformed meta file, an unsupported
/// codebase_version, or a selection naming episodes the dataset lacks.
std::vector<io::EpisodeRef> open_lerobot(const std::filesystem::path& root, const io::EpisodeLayout& layout,
                                         const io::DatasetSelection& selection);

/// The libraries datasets are read with: "Arrow 26.0.1, libavformat 59.27.100, ...".
std::string dataset_libraries();

}  // namespace dzr::dataset
