#pragma once
/// Normalization statistics of experiment_cfg/metadata.json (docs/CHECKPOINTS.md): per embodiment tag, per
/// state and action key, q01/q99 (always) and min/max/mean/std (when the file has them).
#include <map>
#include <string>
#include <vector>

namespace dzr {

/// Statistics of one state or action key ("joint_position"): q01 and q99 always; the others when the
/// file has them (empty otherwise). Stored as float32, as the reference's Normalizer holds them
/// (torch.tensor of the JSON numbers).
struct KeyStatistics {
    std::vector<float> q01, q99, min, max, mean, std;
    size_t dim() const { return q01.size(); }
};

/// Statistics of one embodiment ("oxe_droid").
struct EmbodimentStatistics {
    std::string tag;
    std::map<std::string, KeyStatistics> state;
    std::map<std::string, KeyStatistics> action;

    /// The statistics of `group` ("state" or "action") key `key`. Throws naming the missing entry.
    const KeyStatistics& get(const std::string& group, const std::string& key) const;
};

/// Parses experiment_cfg/metadata.json text. `source` names the file in messages. Every embodiment needs
/// statistics.state and statistics.action objects; each listed key needs q01 and q99 number lists of
/// equal length.
std::map<std::string, EmbodimentStatistics> parse_metadata_json(const std::string& text,
                                                                const std::string& source);

}  // namespace dzr
