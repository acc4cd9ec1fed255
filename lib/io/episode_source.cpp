#include "io/episode_source.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/error.h"

namespace dzr::io {

namespace fs = std::filesystem;

namespace {

/// dzr's episode directories (io/episode.h) behind the source interface.
class DirectorySource final : public EpisodeSource {
public:
    std::string describe() const override { return "episode directories"; }
    std::vector<std::string> check(const EpisodeRef& ref, const EpisodeLayout& layout) const override {
        return check_episode_layout(ref.path, layout);
    }
    std::optional<int64_t> count_frames(const EpisodeRef& ref, const EpisodeOptions& options) const override {
        return count_episode_frames(ref.path, options);
    }
    Episode read(const EpisodeRef& ref, const EpisodeOptions& options) const override {
        return read_episode(ref.path, options);
    }
    std::vector<fs::path> inputs(const EpisodeRef& ref) const override { return {ref.path}; }
};

std::string directory_name(const fs::path& dir) {
    const fs::path p = fs::absolute(dir).lexically_normal();
    std::string name = p.filename().string();
    return name.empty() ? p.parent_path().filename().string() : name;
}

int64_t parse_index(std::string_view s, const std::string& text, const std::string& what) {
    int64_t v = -1;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    DZR_CHECK(ec == std::errc() && end == s.data() + s.size() && v >= 0 && !s.empty(),
              "{} \"{}\": \"{}\" is not an episode index (expected e.g. 0-99,120)", what, text, s);
    return v;
}

}  // namespace

std::string EpisodeRef::location() const {
    return index < 0 ? path.string() : fmt::format("{}#{}", path.string(), id);
}

std::string dataset_episode_id(int64_t index) { return fmt::format("episode_{:06d}", index); }

bool is_dataset_root(const fs::path& path) {
    std::error_code ec;
    return fs::is_directory(path, ec) && fs::exists(fs::symlink_status(path / "meta" / "info.json", ec));
}

std::vector<int64_t> parse_index_ranges(const std::string& text, const std::string& what) {
    // NOTE: a range covers at most this many indices, so that "0-9999999999" fails here, not in memory
    constexpr int64_t kMaxRange = 100'000'000;
    std::set<int64_t> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t end = text.find(',', pos);
        if (end == std::string::npos) end = text.size();
        const std::string_view item = std::string_view(text).substr(pos, end - pos);
        pos = end + 1;
        const size_t dash = item.find('-');
        if (dash == std::string_view::npos) {
            out.insert(parse_index(item, text, what));
            continue;
        }
        const int64_t a = parse_index(item.substr(0, dash), text, what);
        const int64_t b = parse_index(item.substr(dash + 1), text, what);
        DZR_CHECK(a <= b, "{} \"{}\": the range {} is empty (its end is below its start)", what, text, item);
        DZR_CHECK(b - a < kMaxRange, "{} \"{}\": the range {} is longer than {} episodes", what, text, item, kMaxRange);
        for (int64_t i = a; i <= b; ++i) out.insert(i);
    }
    return {out.begin(), out.end()};
}

std::vector<EpisodeRef> list_episode_refs(const fs::path& path, const EpisodeLayout& layout,
                                          const DatasetOpener& open_dataset, const DatasetSelection& selection) {
    if (is_dataset_root(path)) {
        DZR_CHECK(open_dataset, "{} is a LeRobot dataset (it holds meta/info.json), but this build of dzr reads no "
                  "datasets: it was built without Apache Arrow and FFmpeg (see docs/FORMATS.md)", path.string());
        return open_dataset(path, layout, selection);
    }
    DZR_CHECK(selection.empty(), "{}: --episodes and --split select the episodes of a LeRobot dataset, and this is "
              "not one (no meta/info.json)", path.string());
    static const auto directories = std::make_shared<const DirectorySource>();
    std::vector<EpisodeRef> refs;
    for (const fs::path& dir : list_episodes(path, layout)) refs.push_back({directories, directory_name(dir), dir, -1});
    return refs;
}

std::vector<std::string> unique_episode_names(const std::vector<EpisodeRef>& refs) {
    std::vector<std::string> names;
    std::map<std::string, int> seen;
    std::set<std::string> taken;
    for (const EpisodeRef& r : refs) {
        std::string name = r.id;
        for (int k = ++seen[r.id]; taken.count(name); ++k) name = fmt::format("{}_{}", r.id, k);
        taken.insert(name);
        names.push_back(name);
    }
    return names;
}

}  // namespace dzr::io
