#pragma once
/// Per-episode output directory: actions.npy/.csv, JSON reports, CSV, PNG plots and the done
/// marker. Every file is written atomically (temporary file + rename), so an interrupted run leaves
/// whole files or none; the done marker is written last and is what --resume looks for.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/image.h"

namespace dzr::io {

/// The done marker: present only after every other file of the episode was written.
inline constexpr std::string_view kDoneMarker = "done.json";
/// The failure record: the episode could not be run (its error inside); a later attempt removes it.
inline constexpr std::string_view kFailedMarker = "failed.json";

/// The predicted action chunks of one episode, [n_calls, horizon, dims] row-major, with the anchor
/// frame of each call (predicted step s of a call anchored at frame a is the action for frame a + s).
struct ActionChunks {
    int64_t horizon = 24;
    int64_t dims = 8;
    /// actions.csv column names of the dims (empty: joint_0 .. joint_6, gripper for 8 dims, else dim_<d>).
    std::vector<std::string> columns;
    std::vector<int64_t> anchors;
    std::vector<float> values;

    int64_t num_calls() const { return int64_t(anchors.size()); }
    /// Appends one call's chunk (horizon * dims values).
    void append(int64_t anchor, std::span<const float> chunk);
    float at(int64_t call, int64_t step, int64_t dim) const {
        return values[size_t((call * horizon + step) * dims + dim)];
    }
};

/// actions.csv: a header, then one row per (call, step): call, step, frame, then the dims (named by
/// `columns`; by default joint_0 .. joint_6, gripper for 8-D DROID actions).
std::string actions_csv(const ActionChunks& chunks);

class ResultWriter {
public:
    /// Creates `dir` (and parents) when missing.
    explicit ResultWriter(std::filesystem::path dir);

    const std::filesystem::path& dir() const { return dir_; }

    /// actions.npy (float32 [n_calls, horizon, dims]) and actions.csv.
    void write_actions(const ActionChunks& chunks);
    /// `name` relative to the directory; JSON is indented by 2 and ends with a newline.
    void write_json(std::string_view name, const nlohmann::ordered_json& value);
    void write_text(std::string_view name, std::string_view text);
    void write_png(std::string_view name, const Image& image);
    /// `name` as .npy (a host, contiguous tensor of a dtype NPY has).
    void write_npy(std::string_view name, const TensorView& array);
    /// A file that `write` produces atomically at the path it is given (an MP4 encoder, say); recorded
    /// like the others.
    void write_with(std::string_view name, const std::function<void(const std::filesystem::path&)>& write);

    /// Removes a done marker left by an earlier run, before any file is rewritten.
    void clear_done();
    /// Writes the done marker (the list of files written plus `info`); call it last.
    void mark_done(const nlohmann::ordered_json& info = nlohmann::ordered_json::object());

    /// File names written so far, in order.
    const std::vector<std::string>& written() const { return written_; }

    /// True when `dir` holds a done marker (the episode finished; --resume skips it).
    static bool is_done(const std::filesystem::path& dir);

    /// Writes the failure record `dir`/failed.json (creating `dir`), atomically.
    static void mark_failed(const std::filesystem::path& dir, const nlohmann::ordered_json& info);
    /// Removes a failure record left by an earlier attempt (none: nothing to do).
    static void clear_failed(const std::filesystem::path& dir);

private:
    std::filesystem::path file(std::string_view name) const;

    std::filesystem::path dir_;
    std::vector<std::string> written_;
};

}  // namespace dzr::io
