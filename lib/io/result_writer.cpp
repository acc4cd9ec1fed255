#include "io/result_writer.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_text.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/png.h"

namespace dzr::io {

namespace fs = std::filesystem;

void ActionChunks::append(int64_t anchor, std::span<const float> chunk) {
    DZR_CHECK(int64_t(chunk.size()) == horizon * dims, "action chunk for anchor {} has {} values, expected {} x {}",
              anchor, chunk.size(), horizon, dims);
    anchors.push_back(anchor);
    values.insert(values.end(), chunk.begin(), chunk.end());
}

std::string actions_csv(const ActionChunks& c) {
    DZR_ASSERT(int64_t(c.values.size()) == c.num_calls() * c.horizon * c.dims);
    DZR_CHECK(c.columns.empty() || int64_t(c.columns.size()) == c.dims, "actions.csv: {} column names for {} dims",
              c.columns.size(), c.dims);
    std::string out = "call,step,frame";
    for (int64_t d = 0; d < c.dims; ++d)
        out += !c.columns.empty() ? "," + c.columns[size_t(d)]
               : c.dims == 8      ? (d < 7 ? fmt::format(",joint_{}", d) : std::string(",gripper"))
                                  : fmt::format(",dim_{}", d);
    out += "\n";
    for (int64_t k = 0; k < c.num_calls(); ++k)
        for (int64_t s = 0; s < c.horizon; ++s) {
            out += fmt::format("{},{},{}", k, s, c.anchors[size_t(k)] + s);
            // NOTE: {:.9g} round-trips float32 exactly.
            for (int64_t d = 0; d < c.dims; ++d) out += fmt::format(",{:.9g}", c.at(k, s, d));
            out += "\n";
        }
    return out;
}

ResultWriter::ResultWriter(fs::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    DZR_CHECK(!ec && fs::is_directory(dir_), "cannot create output directory {}: {}", dir_.string(),
              ec ? ec.message() : "a file of that name exists");
}

fs::path ResultWriter::file(std::string_view name) const {
    DZR_ASSERT(!name.empty() && name.find('/') == std::string_view::npos);
    return dir_ / std::string(name);
}

void ResultWriter::write_actions(const ActionChunks& chunks) {
    DZR_CHECK(int64_t(chunks.values.size()) == chunks.num_calls() * chunks.horizon * chunks.dims,
              "{}: {} action values for {} calls of {} x {}", dir_.string(), chunks.values.size(), chunks.num_calls(),
              chunks.horizon, chunks.dims);
    write_npy_f32(file("actions.npy"), {chunks.num_calls(), chunks.horizon, chunks.dims}, chunks.values);
    written_.emplace_back("actions.npy");
    write_file_atomic(file("actions.csv"), actions_csv(chunks));
    written_.emplace_back("actions.csv");
}

void ResultWriter::write_json(std::string_view name, const nlohmann::ordered_json& value) {
    write_file_atomic(file(name), dump_json(value) + "\n");
    written_.emplace_back(name);
}

void ResultWriter::write_text(std::string_view name, std::string_view text) {
    write_file_atomic(file(name), text);
    written_.emplace_back(name);
}

void ResultWriter::write_png(std::string_view name, const Image& image) {
    io::write_png(file(name), image);
    written_.emplace_back(name);
}

void ResultWriter::write_npy(std::string_view name, const TensorView& array) {
    io::write_npy(file(name), array);
    written_.emplace_back(name);
}

void ResultWriter::write_with(std::string_view name, const std::function<void(const fs::path&)>& write) {
    write(file(name));
    written_.emplace_back(name);
}

void ResultWriter::clear_done() {
    std::error_code ec;
    fs::remove(dir_ / std::string(kDoneMarker), ec);
    DZR_CHECK(!ec, "cannot remove {}: {}", (dir_ / std::string(kDoneMarker)).string(), ec.message());
}

void ResultWriter::mark_done(const nlohmann::ordered_json& info) {
    nlohmann::ordered_json j = info;
    j["files"] = written_;
    write_file_atomic(dir_ / std::string(kDoneMarker), dump_json(j) + "\n");
}

bool ResultWriter::is_done(const fs::path& dir) {
    std::error_code ec;
    return fs::is_regular_file(dir / std::string(kDoneMarker), ec);
}

void ResultWriter::mark_failed(const fs::path& dir, const nlohmann::ordered_json& info) {
    ResultWriter(dir).write_json(kFailedMarker, info);
}

void ResultWriter::clear_failed(const fs::path& dir) {
    std::error_code ec;
    fs::remove(dir / std::string(kFailedMarker), ec);
    DZR_CHECK(!ec, "cannot remove {}: {}", (dir / std::string(kFailedMarker)).string(), ec.message());
}

}  // namespace dzr::io
