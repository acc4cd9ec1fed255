#pragma once
/// Where a run's episodes come from: dzr's episode directories (io/episode.h) or a recorded dataset (a LeRobot
/// root, lib/dataset/). An episode is named by its source and its id, not by a path: outputs, --resume,
/// --shard and the summaries key on the id ("episode_000042" for a dataset's episode 42, the directory name
/// for a directory).
///
/// The engine library reads datasets only through a DatasetOpener the application passes (as it passes a
/// VideoOpener): Arrow and FFmpeg stay out of it.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/episode.h"

namespace dzr::io {

class EpisodeSource;

/// One episode of a source.
struct EpisodeRef {
    std::shared_ptr<const EpisodeSource> source;
    std::string id;              ///< "episode_000042" or the directory name
    std::filesystem::path path;  ///< the episode directory, or the dataset root
    int64_t index = -1;          ///< the dataset's episode_index; -1 for a directory
    /// What plan.json and messages call the episode: the directory, or "<root>#episode_000042".
    std::string location() const;
};

/// Lists, checks, counts and reads the episodes of one format.
class EpisodeSource {
public:
    virtual ~EpisodeSource() = default;
    /// "LeRobot v2.0 dataset /data/droid" or "episode directories", for logs.
    virtual std::string describe() const = 0;
    /// The problems that keep `ref` from fitting `layout` (one line each, naming the file or key), from
    /// metadata and file headers only; empty when it fits.
    virtual std::vector<std::string> check(const EpisodeRef& ref, const EpisodeLayout& layout) const = 0;
    /// The frames read() would give, without decoding video; nullopt when unknown.
    virtual std::optional<int64_t> count_frames(const EpisodeRef& ref, const EpisodeOptions& options) const = 0;
    /// Reads and validates the episode; throws dzr::Error naming the episode and the file.
    virtual Episode read(const EpisodeRef& ref, const EpisodeOptions& options) const = 0;
    /// The files and directories the episode is read from (no command writes into them).
    virtual std::vector<std::filesystem::path> inputs(const EpisodeRef& ref) const = 0;
};

/// Which of a dataset's episodes a run takes.
struct DatasetSelection {
    std::string episodes;  ///< "0-99,120": episode_index ranges; empty: all
    std::string split;     ///< a split of the dataset's meta/info.json; empty: all
    bool empty() const { return episodes.empty() && split.empty(); }
};

/// Opens a dataset root as a source and lists its selected episodes (apps pass dataset::open_lerobot).
using DatasetOpener = std::function<std::vector<EpisodeRef>(const std::filesystem::path& root, const EpisodeLayout& layout,
                                                            const DatasetSelection& selection)>;

/// True when `path` is a dataset root (it holds meta/info.json).
bool is_dataset_root(const std::filesystem::path& path);

/// The episodes one command-line argument names: a dataset root (through `open_dataset`; an error that names
/// the missing support when it is empty), an episode directory, a directory of them or a list file
/// (io::list_episodes). A selection given for something that is not a dataset is an error.
std::vector<EpisodeRef> list_episode_refs(const std::filesystem::path& path, const EpisodeLayout& layout,
                                          const DatasetOpener& open_dataset, const DatasetSelection& selection);

/// Output names for the episodes: their ids, with "_2", "_3", ... appended when ids repeat.
std::vector<std::string> unique_episode_names(const std::vector<EpisodeRef>& refs);

/// Parses "0-99,120" into sorted, distinct episode indices; throws dzr::Error naming `what` on a bad range.
std::vector<int64_t> parse_index_ranges(const std::string& text, const std::string& what);

/// The id of a dataset's episode: "episode_000042".
std::string dataset_episode_id(int64_t index);

}  // namespace dzr::io
