#include "rollout/episode_layout.h"

#include <fmt/format.h>

namespace dzr::rollout {

io::EpisodeLayout episode_layout(const Embodiment& e) {
    io::EpisodeLayout l;
    l.embodiment = e.tag;
    l.display_name = e.tag == "oxe_droid" ? "DROID" : e.tag;
    l.cameras.clear();
    for (const auto& c : e.cameras) l.cameras.push_back(c.key);
    l.state.clear();
    for (const auto& k : e.state) l.state.emplace_back(k.key, k.dim);
    l.action_dim = e.action_dim();
    l.actions.clear();
    for (const auto& k : e.action) l.actions.emplace_back(k.key, k.dim);
    l.frame_height = e.cameras.empty() ? 0 : e.cameras[0].height;
    l.frame_width = e.cameras.empty() ? 0 : e.cameras[0].width;
    l.fps = e.fps > 0 ? e.fps : io::kDroidFps;
    l.zero_fill_missing_state = e.zero_fill_missing_state;
    return l;
}

std::vector<std::string> action_column_names(const Embodiment& e) {
    std::vector<std::string> out;
    if (e.tag == "oxe_droid" && e.action_dim() == 8) {
        for (int d = 0; d < 7; ++d) out.push_back(fmt::format("joint_{}", d));
        out.push_back("gripper");
        return out;
    }
    for (const auto& k : e.action) {
        if (k.dim == 1) out.push_back(k.key);
        else
            for (int i = 0; i < k.dim; ++i) out.push_back(fmt::format("{}_{}", k.key, i));
    }
    return out;
}

std::vector<ActionKey> action_keys(const Embodiment& e) {
    std::vector<ActionKey> out;
    for (const auto& k : e.action) out.push_back({k.key, k.offset, k.offset + k.dim});
    return out;
}

}  // namespace dzr::rollout
