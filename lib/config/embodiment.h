#pragma once
/// Embodiments: what a DreamZero checkpoint expects of a robot (docs/CHECKPOINTS.md, Embodiments).
///
/// The official policy reads it from the checkpoint itself: experiment_cfg/conf.yaml holds, per embodiment
/// tag, the eval transform chain (`transforms.<tag>`: VideoCrop, VideoResize, StateActionTransform with the
/// normalization mode of every key, ConcatTransform with the camera, state and action orders, DreamTransform
/// with max_state_dim / max_action_dim) and the relative-action keys; experiment_cfg/metadata.json holds the
/// statistics of every key, its width (`modalities.<state|action>.<key>.shape`) and each camera's recorded
/// resolution. An Embodiment is that description in one place; everything downstream (episode layout,
/// canvas composition, state normalization, relative -> absolute actions, outputs, metrics) reads it.
///
/// A checkpoint without experiment_cfg/conf.yaml falls back to the built-in descriptions of oxe_droid,
/// agibot and yam, which follow groot/vla/configs/data/dreamzero/*.yaml of the official code.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/model_config.h"
#include "config/statistics.h"

namespace dzr {

/// StateActionTransform's normalization modes (state_action.py Normalizer); None = the key has no mode and
/// passes through.
enum class NormMode : uint8_t { None, Q99, MeanStd, MinMax, Scale, Binary };

std::string_view norm_mode_name(NormMode mode);
/// "q99", "mean_std", "min_max", "scale", "binary"; nullopt for anything else.
std::optional<NormMode> norm_mode_from_name(std::string_view name);

/// How DreamTransform._prepare_video tiles the views into the model's canvas (dreamzero_cotrain.py).
enum class CanvasLayout : uint8_t {
    DroidWrist,  ///< oxe_droid with >= 3 views: view 2 across the top with every column doubled, view 0
                 ///< bottom-left, view 1 bottom-right (a 2h x 2w canvas)
    Grid,        ///< every other tag with >= 2 views: view 0 top-left, view 1 bottom-left, view 2 top-right,
                 ///< bottom-right black (2h x 2w)
    Single,      ///< one view: the canvas is the view (h x w)
};

std::string_view canvas_layout_name(CanvasLayout layout);

/// The instruction templates of the official collate() (dreamzero_cotrain.py), chosen there by the
/// embodiment's projector index.
enum class PromptTemplate : uint8_t {
    Droid,            ///< oxe_droid: the wrist on top, the two exterior cameras below
    FourViewsHands,   ///< agibot (and xdof): head, right hand, left hand, black
    FourViewsYam,     ///< yam: top, right, left cameras, black
    SingleViewHuman,  ///< gr1_unified, mecka_hands: "A single view video shows that a human ..."
};

std::string_view prompt_template_name(PromptTemplate t);

/// One camera: its key (the part after `video.`) and the frame size its recordings have
/// (metadata.json's resolution, which the official VideoToTensor asserts); 0 x 0 when unknown (frames
/// are then taken at the size they come in).
struct CameraSpec {
    std::string key;
    int height = 0;
    int width = 0;
};

/// One state or action key in concatenation order.
struct ArraySpec {
    std::string key;          ///< without the `state.` / `action.` prefix
    int dim = 0;              ///< its width
    int offset = 0;           ///< its first element in the concatenated vector
    NormMode norm = NormMode::None;
    KeyStatistics stats;      ///< metadata.json's (empty until bound; unused for NormMode::None)
    bool relative = false;    ///< action keys: the model predicts action - state, state.<key> is added back
};

/// The description of one embodiment.
struct Embodiment {
    std::string tag;                       ///< "oxe_droid"
    int projector_index = -1;              ///< embodiment_tag_to_projector_index[tag] (17 for oxe_droid)
    /// The tag -> projector index table the template choice compares against (conf.yaml's, or the official
    /// base.yaml's).
    std::map<std::string, int> projector_indices;
    std::optional<PromptTemplate> prompt;  ///< nullopt: the official collate() has no template for it
    std::vector<CameraSpec> cameras;       ///< ConcatTransform.video_concat_order
    CanvasLayout layout = CanvasLayout::DroidWrist;
    double crop_scale = 0.95;              ///< VideoCrop (eval: centre crop of int(side * scale))
    int view_height = 0, view_width = 0;   ///< VideoResize; 0: half the model canvas (built-ins)
    std::vector<ArraySpec> state;          ///< ConcatTransform.state_concat_order
    std::vector<ArraySpec> action;         ///< ConcatTransform.action_concat_order
    int max_state_dim = 64;                ///< DreamTransform: the state is zero-padded to this
    int max_action_dim = 32;
    int action_horizon = 24;
    std::vector<int> video_eval_delta_indices;  ///< modality_configs.<tag>.video.eval_delta_indices
    double fps = 15.0;                     ///< recordings' frame rate (conf.yaml fps.<tag>, metadata, built-in)
    /// Episodes may omit state keys (zeros, with a warning): the DROID server replaces missing joint and
    /// gripper keys by zeros (SERVER.py:158,168). Other embodiments need every state key.
    bool zero_fill_missing_state = false;
    bool has_statistics = false;           ///< metadata.json's statistics are bound
    std::string source;                    ///< "built-in" or the conf.yaml it came from

    int state_dim() const;
    int action_dim() const;
    const ArraySpec* find_state(std::string_view key) const;
    const ArraySpec* find_action(std::string_view key) const;
    /// A few lines for `dzr ckpt inspect` and logs.
    std::string describe() const;
};

/// The per-view size of the model input: VideoResize's when the embodiment names one, else the model canvas
/// divided by the layout (2 x 2 views, or one view).
std::pair<int, int> embodiment_view_size(const Embodiment& e, const ModelConfig& model);

/// oxe_droid, agibot, yam.
std::vector<std::string> builtin_embodiment_tags();
/// The built-in description of `tag` without statistics. Throws for an unknown tag, listing the known ones.
Embodiment builtin_embodiment(std::string_view tag);
/// The official tag -> projector index table (groot/vla/configs/model/dreamzero/transform/base.yaml).
const std::map<std::string, int>& default_projector_indices();
/// The template the official collate() picks for `index`, comparing it with the table's entries of agibot,
/// oxe_droid, gr1_unified, mecka_hands, xdof and yam in that order.
std::optional<PromptTemplate> prompt_template_for(int index, const std::map<std::string, int>& table);

/// Every embodiment of an experiment_cfg/conf.yaml (the resolved training config), without statistics.
/// `source` names the file in messages. Throws naming the tag and the entry for a transform dzr does not
/// reproduce.
std::map<std::string, Embodiment> parse_experiment_config(const std::string& yaml_text, const std::string& source);

/// What metadata.json says about one embodiment besides the statistics.
struct EmbodimentMetadata {
    EmbodimentStatistics statistics;
    std::map<std::string, std::pair<int, int>> video_resolution;  ///< camera -> (height, width)
    std::map<std::string, double> video_fps;
    std::map<std::string, int> state_dims, action_dims;           ///< modalities.<group>.<key>.shape[0]
};

/// Parses experiment_cfg/metadata.json (statistics as parse_metadata_json, plus the modalities).
std::map<std::string, EmbodimentMetadata> parse_embodiment_metadata(const std::string& text,
                                                                    const std::string& source);

/// Binds metadata.json's entry of the embodiment: key widths (modalities, else the statistics), statistics,
/// camera resolutions and fps. Throws naming the key and the embodiment when a normalized key has no
/// statistics, or when widths disagree.
void bind_metadata(Embodiment& e, const EmbodimentMetadata& md, const std::string& source);

/// The embodiments a checkpoint carries.
struct CheckpointEmbodiments {
    std::filesystem::path dir;
    bool has_conf = false;      ///< experiment_cfg/conf.yaml exists
    bool has_metadata = false;  ///< experiment_cfg/metadata.json exists
    std::vector<Embodiment> embodiments;  ///< bound to metadata.json when it has the tag
    /// Tags of metadata.json without a description (no conf.yaml entry and no built-in), with the reason.
    std::vector<std::pair<std::string, std::string>> unusable;
};

/// Reads experiment_cfg/conf.yaml (when present: its embodiments) and experiment_cfg/metadata.json (the
/// statistics; without conf.yaml, its tags that have a built-in description). Reads no weights.
CheckpointEmbodiments load_checkpoint_embodiments(const std::filesystem::path& dir);

/// The embodiment `tag` of the checkpoint (empty: its only one), with statistics, checked against the model
/// geometry (check_embodiment). Throws naming the tag and what the checkpoint has.
Embodiment select_embodiment(const CheckpointEmbodiments& c, const std::string& tag, const ModelConfig& model);

/// Checks an embodiment against the model: widths within max_state_dim / action_dim, the padding the
/// model takes, the action horizon, the canvas the layout makes, statistics for every normalized key,
/// relative action keys with a state key of the same width, a prompt template. Throws naming the key
/// and the embodiment.
void check_embodiment(const Embodiment& e, const ModelConfig& model);

/// An experiment_cfg/conf.yaml in the official shape for `e` (modality_configs, transforms, relative-action
/// keys, fps, projector indices), as `dzr ckpt make --embodiment` writes it. VideoResize gets the model's
/// view size.
std::string experiment_conf_yaml(const Embodiment& e, const ModelConfig& model);

/// metadata.json statistics of one key from its quantiles: min/max 5% of the range wider, mean the midpoint,
/// std a quarter of the q01..q99 range.
nlohmann::json synthetic_statistics_json(const std::vector<double>& q01, const std::vector<double>& q99);

/// A plausible experiment_cfg/metadata.json for `e` (smooth quantiles per key; relative action keys within
/// +-0.5; camera resolutions of the built-in or 480x640). The keys' widths are `e`'s.
std::string synthetic_metadata_json(const Embodiment& e);

}  // namespace dzr
