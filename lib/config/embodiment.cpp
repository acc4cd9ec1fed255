#include "config/embodiment.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/yaml_text.h"
#include "io/atomic_file.h"

namespace dzr {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kBuiltin = "built-in";


ArraySpec array(std::string key, int dim, NormMode norm, bool relative = false) {
    ArraySpec a;
    a.key = std::move(key);
    a.dim = dim;
    a.norm = norm;
    a.relative = relative;
    return a;
}

void assign_offsets(std::vector<ArraySpec>& keys) {
    int offset = 0;
    for (auto& k : keys) {
        k.offset = offset;
        offset += k.dim;
    }
}

int total_dim(const std::vector<ArraySpec>& keys) {
    int n = 0;
    for (const auto& k : keys) n += k.dim;
    return n;
}

CanvasLayout layout_for(const std::string& tag, size_t views) {
    // NOTE: DreamTransform._prepare_video keys the DROID layout on the tag (and at least 3 views); every
    // other tag with several views gets the 2 x 2 grid, a single view is passed as it is.
    if (tag == "oxe_droid" && views >= 3) return CanvasLayout::DroidWrist;
    return views > 1 ? CanvasLayout::Grid : CanvasLayout::Single;
}

void finish(Embodiment& e) {
    e.layout = layout_for(e.tag, e.cameras.size());
    e.zero_fill_missing_state = e.tag == "oxe_droid";
    if (e.projector_indices.empty()) e.projector_indices = default_projector_indices();
    if (auto it = e.projector_indices.find(e.tag); it != e.projector_indices.end()) e.projector_index = it->second;
    e.prompt = e.projector_index >= 0 ? prompt_template_for(e.projector_index, e.projector_indices) : std::nullopt;
    assign_offsets(e.state);
    assign_offsets(e.action);
}

// ---- conf.yaml reading -------------------------------------------------------------------------------------

/// Reading context of one conf.yaml: the file and the tag whose transforms are read.
struct Conf {
    std::string source;
    std::string where;  // "transforms.oxe_droid.transforms[3]"

    [[noreturn]] void fail(const std::string& what) const { DZR_THROW("{}: {}: {}", source, where, what); }
};

std::string class_name(const YAML::Node& entry) {
    const YAML::Node t = entry["_target_"];
    if (!t || !t.IsScalar()) return {};
    const std::string s = t.Scalar();
    const size_t dot = s.rfind('.');
    return dot == std::string::npos ? s : s.substr(dot + 1);
}

std::vector<std::string> string_list(const YAML::Node& n, const Conf& c, const char* field) {
    if (!n || n.IsNull()) return {};
    if (!n.IsSequence()) c.fail(fmt::format("{} must be a list of keys", field));
    std::vector<std::string> out;
    for (const auto& x : n) {
        if (!x.IsScalar()) c.fail(fmt::format("{} must be a list of keys", field));
        out.push_back(x.Scalar());
    }
    return out;
}

/// "video.wrist_image_left" -> "wrist_image_left"; the prefix must be `group`.
std::string strip_prefix(const std::string& key, std::string_view group, const Conf& c) {
    const std::string prefix = std::string(group) + ".";
    if (key.rfind(prefix, 0) != 0 || key.size() == prefix.size())
        c.fail(fmt::format("'{}' is not a {} key ({}<name>)", key, group, prefix));
    return key.substr(prefix.size());
}

template <typename T>
std::optional<T> scalar(const YAML::Node& n, const Conf& c, const char* field) {
    if (!n || n.IsNull()) return std::nullopt;
    try {
        return n.as<T>();
    } catch (const YAML::Exception&) {
        c.fail(fmt::format("{} has the wrong type ('{}')", field, n.IsScalar() ? n.Scalar() : "a collection"));
    }
}

std::vector<int> int_list(const YAML::Node& n, const Conf& c, const char* field) {
    std::vector<int> out;
    if (!n || n.IsNull()) return out;
    if (!n.IsSequence()) c.fail(fmt::format("{} must be a list of integers", field));
    for (const auto& x : n) out.push_back(*scalar<int>(x, c, field));
    return out;
}

std::map<std::string, int> int_map(const YAML::Node& n, const Conf& c, const char* field) {
    std::map<std::string, int> out;
    if (!n || n.IsNull()) return out;
    if (!n.IsMap()) c.fail(fmt::format("{} must map names to integers", field));
    for (const auto& kv : n) out[kv.first.as<std::string>()] = *scalar<int>(kv.second, c, field);
    return out;
}

/// The transform classes that do nothing in eval mode (video.py get_transform returns None for "eval";
/// StateActionPerturbation / StateActionDropout return the data unchanged when not training).
bool eval_no_op(const std::string& cls) {
    static const std::set<std::string> kNoOps = {
        "VideoColorJitter",  "VideoRandomGrayscale",   "VideoRandomPosterize", "VideoGrayscale",
        "VideoRandomRotation", "VideoHorizontalFlip", "StateActionPerturbation", "StateActionDropout"};
    return kNoOps.count(cls) > 0;
}

struct ParsedTransforms {
    std::vector<std::string> video, state, action;  // ConcatTransform orders (prefixed)
    bool have_concat = false;
    std::optional<double> crop_scale;
    std::optional<int> resize_h, resize_w;
    std::map<std::string, NormMode> modes;  // "state.joint_position" -> mode (keys that are also applied)
    std::optional<int> max_state_dim, max_action_dim, action_horizon;
    std::map<std::string, int> tag_mapping;
};

ParsedTransforms read_transform_list(const YAML::Node& list, Conf c) {
    ParsedTransforms p;
    const std::string base = c.where;
    for (size_t i = 0; i < list.size(); ++i) {
        const YAML::Node t = list[i];
        c.where = fmt::format("{}[{}]", base, i);
        if (!t.IsMap()) c.fail("expected a transform (a map with _target_)");
        const std::string cls = class_name(t);
        if (cls.empty()) c.fail("a transform without _target_");
        c.where += " (" + cls + ")";
        if (cls == "VideoToTensor") {
            if (scalar<bool>(t["output_on_cuda"], c, "output_on_cuda").value_or(false))
                c.fail("output_on_cuda: true (the frames would be resized on the GPU) is not reproduced");
        } else if (cls == "VideoToNumpy" || eval_no_op(cls)) {
            // nothing in eval mode beyond the uint8 round trip the resize already ends with
        } else if (cls == "VideoCrop") {
            if ((t["height"] && !t["height"].IsNull()) || (t["width"] && !t["width"].IsNull()))
                c.fail("an explicit crop input height/width is not supported (the recorded resolution of "
                       "metadata.json is used)");
            p.crop_scale = scalar<double>(t["scale"], c, "scale");
            if (!p.crop_scale || !(*p.crop_scale > 0.0 && *p.crop_scale <= 1.0)) c.fail("scale must be in (0, 1]");
        } else if (cls == "VideoResize") {
            p.resize_h = scalar<int>(t["height"], c, "height");
            p.resize_w = scalar<int>(t["width"], c, "width");
            if (!p.resize_h || !p.resize_w || *p.resize_h < 1 || *p.resize_w < 1)
                c.fail("height and width must be positive integers");
            const std::string interp = scalar<std::string>(t["interpolation"], c, "interpolation").value_or("linear");
            if (interp != "linear")
                c.fail(fmt::format("interpolation '{}' is not reproduced (only linear: torchvision bilinear)", interp));
            if (!scalar<bool>(t["antialias"], c, "antialias").value_or(true))
                c.fail("antialias: false is not reproduced (torchvision's anti-aliased bilinear is)");
            if (scalar<std::string>(t["backend"], c, "backend").value_or("torchvision") != "torchvision")
                c.fail("only the torchvision backend is reproduced");
        } else if (cls == "StateActionToTensor") {
            const YAML::Node od = t["output_dtypes"];
            if (od && od.IsMap() && od.size() > 0) c.fail("output_dtypes casts are not reproduced");
        } else if (cls == "StateActionTransform") {
            const YAML::Node rot = t["target_rotations"];
            if (rot && rot.IsMap() && rot.size() > 0) c.fail("target_rotations (rotation conversions) are not reproduced");
            const std::vector<std::string> apply = string_list(t["apply_to"], c, "apply_to");
            const YAML::Node modes = t["normalization_modes"];
            if (modes && !modes.IsNull()) {
                if (!modes.IsMap()) c.fail("normalization_modes must map keys to modes");
                for (const auto& kv : modes) {
                    const std::string key = kv.first.as<std::string>();
                    const std::string name = kv.second.IsScalar() ? kv.second.Scalar() : "";
                    const auto mode = norm_mode_from_name(name);
                    if (!mode)
                        c.fail(fmt::format("normalization mode '{}' of {} is not one of q99, mean_std, min_max, "
                                           "scale, binary", name, key));
                    // NOTE: the reference normalizes a key only when it is also in apply_to.
                    if (std::find(apply.begin(), apply.end(), key) != apply.end()) p.modes[key] = *mode;
                }
            }
        } else if (cls == "ConcatTransform") {
            p.video = string_list(t["video_concat_order"], c, "video_concat_order");
            p.state = string_list(t["state_concat_order"], c, "state_concat_order");
            p.action = string_list(t["action_concat_order"], c, "action_concat_order");
            p.have_concat = true;
        } else if (cls == "DreamTransform") {
            p.max_state_dim = scalar<int>(t["max_state_dim"], c, "max_state_dim");
            p.max_action_dim = scalar<int>(t["max_action_dim"], c, "max_action_dim");
            p.action_horizon = scalar<int>(t["action_horizon"], c, "action_horizon");
            if (scalar<int>(t["state_horizon"], c, "state_horizon").value_or(1) != 1)
                c.fail("state_horizon other than 1 is not reproduced (DreamZero feeds one state token)");
            p.tag_mapping = int_map(t["embodiment_tag_mapping"], c, "embodiment_tag_mapping");
        } else {
            c.fail(fmt::format("transform {} is not reproduced by dzr", t["_target_"].Scalar()));
        }
    }
    return p;
}

/// n[a] (or n[a][b]) when present, else a null node. NOTE: yaml-cpp's operator[] on a const node yields an
/// invalid node for a missing key, which throws when assigned or queried; this never does.
YAML::Node child(const YAML::Node& n, const char* a, const char* b = nullptr) {
    if (!n.IsDefined() || !n.IsMap()) return YAML::Node();
    YAML::Node m = n;
    YAML::Node x = m[a];
    if (!x.IsDefined()) return YAML::Node();
    if (!b) return x;
    return child(x, b);
}

// ---- metadata.json ----------------------------------------------------------------------------------------

std::optional<int> shape_dim(const json& entry) {
    if (!entry.is_object() || !entry.contains("shape")) return std::nullopt;
    const json& s = entry["shape"];
    if (s.is_array() && s.size() == 1 && s[0].is_number_integer()) return s[0].get<int>();
    if (s.is_number_integer()) return s.get<int>();
    return std::nullopt;
}

// ---- synthetic statistics ---------------------------------------------------------------------------------

bool gripper_like(const std::string& key) {
    return key.find("gripper") != std::string::npos || key.find("effector") != std::string::npos;
}

}  // namespace

nlohmann::json synthetic_statistics_json(const std::vector<double>& q01, const std::vector<double>& q99) {
    std::vector<double> mn, mx, mean, sd;
    for (size_t i = 0; i < q01.size(); ++i) {
        const double span = q99[i] - q01[i];
        mn.push_back(q01[i] - 0.05 * span);
        mx.push_back(q99[i] + 0.05 * span);
        mean.push_back(0.5 * (q01[i] + q99[i]));
        sd.push_back(0.25 * span);
    }
    return json{{"q01", q01}, {"q99", q99}, {"min", mn}, {"max", mx}, {"mean", mean}, {"std", sd}};
}

namespace {

/// Quantiles of a key: grippers and effectors in [0, 1], relative actions within +-0.5, other keys
/// (joints, head, waist, velocities) over a spread of ranges around 0.
json synthetic_key_stats(const ArraySpec& k, bool action) {
    std::vector<double> q01, q99;
    const bool relative = action && k.relative;
    for (int i = 0; i < k.dim; ++i) {
        if (gripper_like(k.key)) {
            q01.push_back(relative ? -0.5 : 0.0);
            q99.push_back(relative ? 0.5 : 1.0);
        } else if (relative) {
            q01.push_back(-0.5);
            q99.push_back(0.5);
        } else {
            const double half = 0.9 + 0.15 * double(i % 5);
            const double centre = 0.2 * std::sin(1.3 * double(i + 1));
            q01.push_back(centre - half);
            q99.push_back(centre + half);
        }
    }
    return synthetic_statistics_json(q01, q99);
}

}  // namespace

// ---- names ----------------------------------------------------------------------------------------------

std::string_view norm_mode_name(NormMode mode) {
    switch (mode) {
        case NormMode::None: return "none";
        case NormMode::Q99: return "q99";
        case NormMode::MeanStd: return "mean_std";
        case NormMode::MinMax: return "min_max";
        case NormMode::Scale: return "scale";
        case NormMode::Binary: return "binary";
    }
    return "?";
}

std::optional<NormMode> norm_mode_from_name(std::string_view name) {
    for (NormMode m : {NormMode::Q99, NormMode::MeanStd, NormMode::MinMax, NormMode::Scale, NormMode::Binary})
        if (norm_mode_name(m) == name) return m;
    return std::nullopt;
}

std::string_view canvas_layout_name(CanvasLayout layout) {
    switch (layout) {
        case CanvasLayout::DroidWrist: return "droid (view 2 on top, columns doubled; views 0 | 1 below)";
        case CanvasLayout::Grid: return "grid (view 0 top-left, 1 bottom-left, 2 top-right, bottom-right black)";
        case CanvasLayout::Single: return "single view";
    }
    return "?";
}

std::string_view prompt_template_name(PromptTemplate t) {
    switch (t) {
        case PromptTemplate::Droid: return "oxe_droid (wrist on top, exterior cameras below)";
        case PromptTemplate::FourViewsHands: return "agibot (head, right hand, left hand, black)";
        case PromptTemplate::FourViewsYam: return "yam (top, right, left cameras, black)";
        case PromptTemplate::SingleViewHuman: return "single view, human";
    }
    return "?";
}

// ---- Embodiment -------------------------------------------------------------------------------------------

int Embodiment::state_dim() const { return total_dim(state); }
int Embodiment::action_dim() const { return total_dim(action); }

const ArraySpec* Embodiment::find_state(std::string_view key) const {
    for (const auto& k : state)
        if (k.key == key) return &k;
    return nullptr;
}

const ArraySpec* Embodiment::find_action(std::string_view key) const {
    for (const auto& k : action)
        if (k.key == key) return &k;
    return nullptr;
}

std::string Embodiment::describe() const {
    auto keys = [](const std::vector<ArraySpec>& v) {
        std::vector<std::string> out;
        for (const auto& k : v)
            out.push_back(fmt::format("{}[{}] {}{}", k.key, k.dim, norm_mode_name(k.norm), k.relative ? " relative" : ""));
        return fmt::format("{}", fmt::join(out, ", "));
    };
    std::vector<std::string> cams;
    for (const auto& c : cameras)
        cams.push_back(c.height > 0 ? fmt::format("{} {}x{}", c.key, c.height, c.width) : c.key + " (any size)");
    auto or_model = [](int v) { return v > 0 ? std::to_string(v) : std::string("the model's"); };
    std::string s = fmt::format("{} (projector index {}; {})\n", tag, projector_index, source);
    s += fmt::format("  cameras: {}\n", fmt::join(cams, ", "));
    s += fmt::format("  canvas: {}; centre crop {}, views {}\n", canvas_layout_name(layout), crop_scale,
                     view_height > 0 ? fmt::format("{}x{}", view_height, view_width) : std::string("half the canvas"));
    s += fmt::format("  state ({} dims, padded to {}): {}\n", state_dim(), or_model(max_state_dim), keys(state));
    s += fmt::format("  action ({} dims of {}, horizon {}): {}\n", action_dim(), or_model(max_action_dim),
                     or_model(action_horizon), keys(action));
    s += fmt::format("  prompt template: {}; {} fps; eval video deltas [{}]; statistics: {}\n",
                     prompt ? prompt_template_name(*prompt) : std::string_view("none (the official code has none)"),
                     fps, fmt::join(video_eval_delta_indices, ", "), has_statistics ? "metadata.json" : "missing");
    return s;
}

std::pair<int, int> embodiment_view_size(const Embodiment& e, const ModelConfig& model) {
    if (e.view_height > 0 && e.view_width > 0) return {e.view_height, e.view_width};
    const int f = e.layout == CanvasLayout::Single ? 1 : 2;
    return {model.canvas_height / f, model.canvas_width / f};
}

// ---- built-ins ----------------------------------------------------------------------------------------------

std::vector<std::string> builtin_embodiment_tags() { return {"oxe_droid", "agibot", "yam"}; }

Embodiment builtin_embodiment(std::string_view tag) {
    Embodiment e;
    e.tag = std::string(tag);
    e.source = kBuiltin;
    // NOTE: 0 = the model's (config.json) for the padding widths and the horizon: the built-ins describe the
    // data, the checkpoint's geometry decides the rest.
    e.max_state_dim = 0;
    e.max_action_dim = 0;
    e.action_horizon = 0;
    const NormMode q = NormMode::Q99;
    if (tag == "oxe_droid") {
        // base_48_wan_fine_aug_relative.yaml modality_config_oxe_droid / transform_oxe_droid and
        // droid_relative.yaml (relative_action_keys); 180x320 recordings at 15 fps.
        for (const char* cam : {"exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"})
            e.cameras.push_back({cam, 180, 320});
        e.state = {array("joint_position", 7, q), array("gripper_position", 1, q)};
        e.action = {array("joint_position", 7, q, true), array("gripper_position", 1, q)};
        e.video_eval_delta_indices = {0};
        e.fps = 15.0;
    } else if (tag == "agibot") {
        // modality_config_agibot / transform_agibot and agibot_relative.yaml; key widths and the 480x640
        // 30 fps recordings from scripts/data/convert_agibot.py (state 20, action 22).
        for (const char* cam : {"top_head", "hand_left", "hand_right"}) e.cameras.push_back({cam, 480, 640});
        const std::pair<const char*, int> keys[] = {{"left_arm_joint_position", 7}, {"right_arm_joint_position", 7},
                                                    {"left_effector_position", 1},  {"right_effector_position", 1},
                                                    {"head_position", 2},           {"waist_position", 2}};
        for (const auto& [k, d] : keys) {
            e.state.push_back(array(k, d, q));
            e.action.push_back(array(k, d, q, true));
        }
        e.action.push_back(array("robot_velocity", 2, q));
        e.video_eval_delta_indices = {-3, -2, -1, 0};
        e.fps = 30.0;
    } else if (tag == "yam") {
        // modality_config_yam / transform_yam and yam_relative.yaml (every key relative); fps 30 from the base
        // yaml's fps map; widths from scripts/open_loop_yam.py. The recorded resolution is not in the official
        // code: frames are used at the size they come in.
        for (const char* cam : {"top_camera-images-rgb", "left_camera-images-rgb", "right_camera-images-rgb"})
            e.cameras.push_back({cam, 0, 0});
        const std::pair<const char*, int> keys[] = {
            {"left_joint_pos", 6}, {"left_gripper_pos", 1}, {"right_joint_pos", 6}, {"right_gripper_pos", 1}};
        for (const auto& [k, d] : keys) {
            e.state.push_back(array(k, d, q));
            e.action.push_back(array(k, d, q, true));
        }
        e.video_eval_delta_indices = {0};
        e.fps = 30.0;
    } else {
        DZR_THROW("unknown embodiment '{}' (built-in: {})", tag, fmt::join(builtin_embodiment_tags(), ", "));
    }
    finish(e);
    return e;
}

const std::map<std::string, int>& default_projector_indices() {
    // groot/vla/configs/model/dreamzero/transform/base.yaml embodiment_tag_to_projector_index
    static const std::map<std::string, int> kTable = {
        {"real_gr1_arms_only", 0},
        {"real_gr1_arms_only_annotated", 1},
        {"real_gr1_arms_waist", 2},
        {"real_gr1_arms_waist_annotated", 3},
        {"dexmg_gr1_arms_only_inspire", 4},
        {"dexmg_gr1_arms_only_fourier", 5},
        {"dexmg_gr1_arms_waist_fourier", 6},
        {"robocasa_single_arm", 7},
        {"onex_eve_gripper", 8},
        {"robocasa_gr1_arms_only_inspire_hands", 9},
        {"robocasa_gr1_arms_only_fourier_hands", 10},
        {"robocasa_gr1_fixed_lower_body_inspire_hands", 11},
        {"robocasa_gr1_fixed_lower_body_fourier_hands", 12},
        {"robocasa_panda_omron", 13},
        {"robocasa_bimanual_panda_parallel_gripper", 15},
        {"robocasa_bimanual_panda_inspire_hand", 16},
        {"oxe_droid", 17},
        {"oxe_fractal", 18},
        {"oxe_language_table", 19},
        {"oxe_bridge", 20},
        {"real_panda_single_arm", 21},
        {"hot3d_hands_only", 23},
        {"gr1_unified", 24},
        {"robocasa_gr1_arms_waist_fourier_hands", 25},
        {"agibot", 26},
        {"lapa", 27},
        {"oxe_mutex", 28},
        {"oxe_roboset", 29},
        {"oxe_plex", 30},
        {"dream", 31},
        {"yam", 32},
        {"xdof", 22},
        {"gr1_unified_segmentation", 14},
        {"language_table_sim", 7},
        {"gr1_isaac", 0},
        {"sim_behavior_r1_pro", 31},
        {"mecka_hands", 27},
        {"real_r1_pro_sharpa", 28},
    };
    return kTable;
}

std::optional<PromptTemplate> prompt_template_for(int index, const std::map<std::string, int>& table) {
    auto is = [&](const char* tag) {
        auto it = table.find(tag);
        return it != table.end() && it->second == index;
    };
    // NOTE: collate() tests the ids in this order; the agibot branch also needs num_views > 1, which holds in
    // eval (DreamTransform's num_views defaults to 3).
    if (is("agibot")) return PromptTemplate::FourViewsHands;
    if (is("oxe_droid")) return PromptTemplate::Droid;
    if (is("gr1_unified") || is("mecka_hands")) return PromptTemplate::SingleViewHuman;
    if (is("xdof")) return PromptTemplate::FourViewsHands;
    if (is("yam")) return PromptTemplate::FourViewsYam;
    return std::nullopt;
}

// ---- conf.yaml -----------------------------------------------------------------------------------------------

std::map<std::string, Embodiment> parse_experiment_config(const std::string& yaml_text, const std::string& source) {
    YAML::Node root;
    try {
        root = YAML::Load(yaml_text);
    } catch (const YAML::Exception& e) {
        DZR_THROW("{}: invalid YAML at line {}: {}", source, e.mark.line + 1, e.msg);
    }
    check_yaml_unique_keys(root, source);
    Conf c{source, "(top level)"};
    if (!root.IsMap()) c.fail("expected a mapping (the resolved training config)");
    YAML::Node transforms = child(root, "transforms");
    if (!transforms || !transforms.IsMap()) transforms = child(root, "train_dataset", "all_transforms");
    if (!transforms || !transforms.IsMap())
        c.fail("no `transforms` map (the per-embodiment eval transforms the policy instantiates)");
    YAML::Node modality = child(root, "modality_configs");
    if (!modality || !modality.IsMap()) modality = child(root, "train_dataset", "all_modality_configs");

    try {
        c.where = "relative_action_per_horizon";
        if (scalar<bool>(root["relative_action_per_horizon"], c, "relative_action_per_horizon").value_or(false))
            c.fail("per-horizon relative actions (PerHorizonActionTransform) are not reproduced");
        c.where = "relative_action";
        const bool relative = scalar<bool>(root["relative_action"], c, "relative_action").value_or(false);
        c.where = "relative_action_keys";
        const std::vector<std::string> relative_keys =
            relative ? string_list(root["relative_action_keys"], c, "relative_action_keys") : std::vector<std::string>{};
        c.where = "embodiment_tag_to_projector_index";
        std::map<std::string, int> table =
            int_map(root["embodiment_tag_to_projector_index"], c, "embodiment_tag_to_projector_index");
        YAML::Node fps = child(root, "fps");

        std::map<std::string, Embodiment> out;
        for (const auto& kv : transforms) {
            const std::string tag = kv.first.as<std::string>();
            c.where = fmt::format("transforms.{}", tag);
            const YAML::Node composed = kv.second;
            if (!composed.IsMap() || !composed["transforms"] || !composed["transforms"].IsSequence())
                c.fail("expected a ComposedModalityTransform with a `transforms` list");
            c.where += ".transforms";
            const ParsedTransforms p = read_transform_list(composed["transforms"], c);
            c.where = fmt::format("transforms.{}", tag);
            if (!p.have_concat) c.fail("no ConcatTransform (the camera, state and action orders)");
            if (p.video.empty()) c.fail("ConcatTransform has no video_concat_order");

            Embodiment e;
            e.tag = tag;
            e.source = source;
            for (const auto& v : p.video) e.cameras.push_back({strip_prefix(v, "video", c), 0, 0});
            for (const auto& s : p.state) {
                ArraySpec a;
                a.key = strip_prefix(s, "state", c);
                if (auto it = p.modes.find(s); it != p.modes.end()) a.norm = it->second;
                e.state.push_back(std::move(a));
            }
            for (const auto& s : p.action) {
                ArraySpec a;
                a.key = strip_prefix(s, "action", c);
                if (auto it = p.modes.find(s); it != p.modes.end()) a.norm = it->second;
                a.relative = std::find(relative_keys.begin(), relative_keys.end(), a.key) != relative_keys.end();
                e.action.push_back(std::move(a));
            }
            if (p.crop_scale) e.crop_scale = *p.crop_scale;
            else e.crop_scale = 1.0;  // no VideoCrop: the whole frame
            if (p.resize_h) {
                e.view_height = *p.resize_h;
                e.view_width = *p.resize_w;
            }
            c.where = "max_state_dim";
            e.max_state_dim = p.max_state_dim.value_or(scalar<int>(root["max_state_dim"], c, "max_state_dim").value_or(0));
            c.where = "max_action_dim";
            e.max_action_dim =
                p.max_action_dim.value_or(scalar<int>(root["max_action_dim"], c, "max_action_dim").value_or(0));
            c.where = "action_horizon";
            e.action_horizon =
                p.action_horizon.value_or(scalar<int>(root["action_horizon"], c, "action_horizon").value_or(0));
            e.projector_indices = !table.empty() ? table : !p.tag_mapping.empty() ? p.tag_mapping : default_projector_indices();
            if (modality && modality.IsMap() && modality[tag] && modality[tag].IsMap()) {
                const YAML::Node video = modality[tag]["video"];
                c.where = fmt::format("modality_configs.{}.video", tag);
                if (video && video.IsMap()) {
                    e.video_eval_delta_indices = int_list(video["eval_delta_indices"], c, "eval_delta_indices");
                    if (e.video_eval_delta_indices.empty())
                        e.video_eval_delta_indices = int_list(video["delta_indices"], c, "delta_indices");
                }
            }
            e.fps = 0.0;  // metadata.json's, unless the config names one
            if (fps && fps.IsMap() && fps[tag] && !fps[tag].IsNull()) {
                c.where = fmt::format("fps.{}", tag);
                e.fps = *scalar<double>(fps[tag], c, "fps");
                if (!(e.fps > 0)) c.fail("fps must be positive");
            }
            finish(e);
            out.emplace(tag, std::move(e));
        }
        return out;
    } catch (const YAML::Exception& e) {
        DZR_THROW("{}: {}: line {}: {}", source, c.where, e.mark.line + 1, e.msg);
    }
}

// ---- metadata.json -----------------------------------------------------------------------------------------

std::map<std::string, EmbodimentMetadata> parse_embodiment_metadata(const std::string& text, const std::string& source) {
    std::map<std::string, EmbodimentStatistics> stats = parse_metadata_json(text, source);
    const json root = json::parse(text);  // valid: parse_metadata_json accepted it
    std::map<std::string, EmbodimentMetadata> out;
    for (auto& [tag, st] : stats) {
        EmbodimentMetadata md;
        md.statistics = std::move(st);
        const json& emb = root[tag];
        if (emb.contains("modalities") && emb["modalities"].is_object()) {
            const json& m = emb["modalities"];
            if (m.contains("video") && m["video"].is_object())
                for (const auto& [cam, v] : m["video"].items()) {
                    if (!v.is_object()) continue;
                    if (v.contains("resolution")) {
                        const json& r = v["resolution"];
                        DZR_CHECK(r.is_array() && r.size() == 2 && r[0].is_number_integer() && r[1].is_number_integer() &&
                                      r[0].get<int>() > 0 && r[1].get<int>() > 0,
                                  "{}: {}.modalities.video.{}.resolution must be [width, height], got {}", source, tag,
                                  cam, r.dump());
                        md.video_resolution[cam] = {r[1].get<int>(), r[0].get<int>()};  // [W, H] -> (H, W)
                    }
                    if (v.contains("fps") && v["fps"].is_number()) md.video_fps[cam] = v["fps"].get<double>();
                }
            for (const auto& [group, dst] : {std::pair{"state", &md.state_dims}, std::pair{"action", &md.action_dims}}) {
                if (!m.contains(group) || !m[group].is_object()) continue;
                for (const auto& [key, entry] : m[group].items())
                    if (auto d = shape_dim(entry)) (*dst)[key] = *d;
            }
        }
        out.emplace(tag, std::move(md));
    }
    return out;
}

void bind_metadata(Embodiment& e, const EmbodimentMetadata& md, const std::string& source) {
    const auto bind = [&](std::vector<ArraySpec>& keys, const std::map<std::string, KeyStatistics>& stats,
                          const std::map<std::string, int>& dims, const char* group) {
        for (auto& k : keys) {
            const auto st = stats.find(k.key);
            const auto dm = dims.find(k.key);
            if (dm != dims.end()) {
                k.dim = dm->second;
            } else if (st != stats.end()) {
                k.dim = int(st->second.dim());
            }
            DZR_CHECK(k.dim > 0, "{}: embodiment {}: {}.{} has no width (neither modalities.{}.{}.shape nor its "
                      "statistics)", source, e.tag, group, k.key, group, k.key);
            if (k.norm == NormMode::None) continue;
            DZR_CHECK(st != stats.end(), "{}: embodiment {} has no statistics for {}.{} (its {} normalization needs "
                      "them)", source, e.tag, group, k.key, norm_mode_name(k.norm));
            DZR_CHECK(int(st->second.dim()) == k.dim, "{}: embodiment {}: the statistics of {}.{} have {} values but "
                      "the key is {} wide", source, e.tag, group, k.key, st->second.dim(), k.dim);
            const bool need_mean = k.norm == NormMode::MeanStd;
            const bool need_range = k.norm == NormMode::MinMax || k.norm == NormMode::Scale;
            DZR_CHECK(!need_mean || (!st->second.mean.empty() && !st->second.std.empty()),
                      "{}: embodiment {}: {}.{} is normalized mean_std but its statistics have no mean/std", source,
                      e.tag, group, k.key);
            DZR_CHECK(!need_range || (!st->second.min.empty() && !st->second.max.empty()),
                      "{}: embodiment {}: {}.{} is normalized {} but its statistics have no min/max", source, e.tag,
                      group, k.key, norm_mode_name(k.norm));
            k.stats = st->second;
        }
        assign_offsets(keys);
    };
    bind(e.state, md.statistics.state, md.state_dims, "state");
    bind(e.action, md.statistics.action, md.action_dims, "action");
    for (auto& c : e.cameras)
        if (auto it = md.video_resolution.find(c.key); it != md.video_resolution.end()) {
            c.height = it->second.first;
            c.width = it->second.second;
        }
    if (!(e.fps > 0)) {
        for (const auto& c : e.cameras)
            if (auto it = md.video_fps.find(c.key); it != md.video_fps.end() && it->second > 0) {
                e.fps = it->second;
                break;
            }
        if (!(e.fps > 0)) e.fps = 15.0;
    }
    e.has_statistics = true;
}

// ---- a checkpoint's embodiments -------------------------------------------------------------------------------

CheckpointEmbodiments load_checkpoint_embodiments(const fs::path& dir) {
    CheckpointEmbodiments c;
    c.dir = dir;
    const fs::path conf = dir / "experiment_cfg" / "conf.yaml";
    const fs::path meta = dir / "experiment_cfg" / "metadata.json";
    std::error_code ec;
    c.has_conf = fs::is_regular_file(conf, ec);
    c.has_metadata = fs::is_regular_file(meta, ec);
    std::map<std::string, EmbodimentMetadata> md;
    if (c.has_metadata) md = parse_embodiment_metadata(io::read_file(meta), meta.string());

    std::map<std::string, Embodiment> described;
    if (c.has_conf) {
        described = parse_experiment_config(io::read_file(conf), conf.string());
    } else {
        const auto builtins = builtin_embodiment_tags();
        for (const auto& [tag, m] : md) {
            if (std::find(builtins.begin(), builtins.end(), tag) != builtins.end())
                described.emplace(tag, builtin_embodiment(tag));
            else
                c.unusable.emplace_back(tag, fmt::format("{}: embodiment {} has statistics but the checkpoint has no "
                                                         "experiment_cfg/conf.yaml and dzr has no built-in description "
                                                         "of it (built-in: {})", meta.string(), tag,
                                                         fmt::join(builtins, ", ")));
        }
    }
    for (auto& [tag, e] : described) {
        if (auto it = md.find(tag); it != md.end()) {
            try {
                bind_metadata(e, it->second, meta.string());
            } catch (const Error& err) {
                c.unusable.emplace_back(tag, err.what());
                continue;
            }
        }
        c.embodiments.push_back(std::move(e));
    }
    if (c.has_conf)
        for (const auto& [tag, m] : md)
            if (!described.count(tag))
                c.unusable.emplace_back(tag, fmt::format("{}: embodiment {} has statistics but {} has no transforms for it",
                                                         meta.string(), tag, conf.string()));
    return c;
}

Embodiment select_embodiment(const CheckpointEmbodiments& c, const std::string& tag, const ModelConfig& model) {
    std::vector<std::string> usable, all;
    for (const auto& e : c.embodiments) {
        all.push_back(e.tag);
        if (e.has_statistics) usable.push_back(e.tag);
    }
    for (const auto& [t, why] : c.unusable) all.push_back(t);
    const std::string listed = all.empty() ? std::string("none") : fmt::format("{}", fmt::join(all, ", "));
    DZR_CHECK(c.has_metadata, "checkpoint {}: experiment_cfg/metadata.json is missing (q01/q99 statistics)",
              c.dir.string());
    std::string want = tag;
    if (want.empty()) {
        if (usable.size() == 1) {
            want = usable[0];
        } else if (usable.empty()) {
            std::string msg = fmt::format("checkpoint {} has no usable embodiment", c.dir.string());
            for (const auto& [t, why] : c.unusable) msg += "\n  " + why;
            DZR_THROW("{}", msg);
        } else {
            DZR_THROW("checkpoint {} carries several embodiments ({}): choose one with --embodiment", c.dir.string(),
                      fmt::join(usable, ", "));
        }
    }
    for (const auto& [t, why] : c.unusable)
        if (t == want) DZR_THROW("{}", why);
    for (const auto& e : c.embodiments) {
        if (e.tag != want) continue;
        DZR_CHECK(e.has_statistics, "checkpoint {}: experiment_cfg/metadata.json has no statistics for embodiment {} "
                  "(it has statistics for: {})", c.dir.string(), want,
                  usable.empty() ? std::string("none") : fmt::format("{}", fmt::join(usable, ", ")));
        check_embodiment(e, model);
        return e;
    }
    DZR_THROW("unknown embodiment '{}': checkpoint {} carries {}", want, c.dir.string(), listed);
}

void check_embodiment(const Embodiment& e, const ModelConfig& model) {
    const std::string who = "embodiment " + e.tag;
    DZR_CHECK(!e.cameras.empty(), "{}: no cameras", who);
    DZR_CHECK(e.prompt.has_value(), "{} (projector index {}): the official collate() has no prompt template for it "
              "(it knows agibot, oxe_droid, gr1_unified, mecka_hands, xdof and yam)", who, e.projector_index);
    const int f = e.layout == CanvasLayout::Single ? 1 : 2;
    if (e.view_height > 0) {
        DZR_CHECK(f * e.view_height == model.canvas_height && f * e.view_width == model.canvas_width,
                  "{}: VideoResize makes {}x{} views, so the canvas ({}) is {}x{}, but the model's canvas is {}x{}", who,
                  e.view_height, e.view_width, canvas_layout_name(e.layout), f * e.view_height, f * e.view_width,
                  model.canvas_height, model.canvas_width);
    } else {
        DZR_CHECK(model.canvas_height % f == 0 && model.canvas_width % f == 0,
                  "{}: the model's {}x{} canvas does not split into {} views", who, model.canvas_height,
                  model.canvas_width, f * f);
    }
    for (const auto& c : e.cameras) {
        DZR_CHECK((c.height == 0) == (c.width == 0) && c.height >= 0, "{}: camera {} has a frame size of {}x{}", who,
                  c.key, c.height, c.width);
        if (c.height > 0)
            DZR_CHECK(int(c.height * e.crop_scale) >= 1 && int(c.width * e.crop_scale) >= 1,
                      "{}: camera {}: a {} crop of {}x{} frames is empty", who, c.key, e.crop_scale, c.height, c.width);
    }
    // NOTE: the official VideoCrop asserts one resolution for every camera.
    for (const auto& c : e.cameras)
        DZR_CHECK(c.height == e.cameras[0].height && c.width == e.cameras[0].width,
                  "{}: cameras {} ({}x{}) and {} ({}x{}) differ in resolution; VideoCrop needs one", who,
                  e.cameras[0].key, e.cameras[0].height, e.cameras[0].width, c.key, c.height, c.width);

    DZR_CHECK(!e.action.empty(), "{}: no action keys", who);
    const int state_pad = e.max_state_dim > 0 ? e.max_state_dim : model.dit.max_state_dim;
    DZR_CHECK(state_pad == model.dit.max_state_dim, "{}: DreamTransform pads the state to {} but the model's state "
              "encoder takes {} (max_state_dim)", who, state_pad, model.dit.max_state_dim);
    DZR_CHECK(e.state_dim() <= state_pad, "{}: the state is {} wide, more than max_state_dim {}", who, e.state_dim(),
              state_pad);
    const int action_pad = e.max_action_dim > 0 ? e.max_action_dim : model.dit.action_dim;
    DZR_CHECK(action_pad == model.dit.action_dim, "{}: DreamTransform pads actions to {} but the model's action width "
              "is {}", who, action_pad, model.dit.action_dim);
    DZR_CHECK(e.action_dim() <= action_pad, "{}: the action is {} wide, more than the model's {}", who, e.action_dim(),
              action_pad);
    if (e.action_horizon > 0)
        DZR_CHECK(e.action_horizon == model.dit.num_action_per_block, "{}: action horizon {} but the model predicts {} "
                  "actions per call", who, e.action_horizon, model.dit.num_action_per_block);
    DZR_CHECK(e.has_statistics, "{}: no statistics (experiment_cfg/metadata.json)", who);
    for (const auto* group : {&e.state, &e.action})
        for (const auto& k : *group) {
            const char* g = group == &e.state ? "state" : "action";
            DZR_CHECK(k.dim > 0, "{}: {}.{} has no width", who, g, k.key);
            if (k.norm != NormMode::None)
                DZR_CHECK(int(k.stats.dim()) == k.dim, "{}: {}.{} is {} wide but has {} statistics", who, g, k.key,
                          k.dim, k.stats.dim());
        }
    for (const auto& k : e.action) {
        DZR_CHECK(k.norm != NormMode::Scale, "{}: action.{} is normalized with `scale`, which has no inverse (the "
                  "official Normalizer.inverse raises too)", who, k.key);
        if (!k.relative) continue;
        const ArraySpec* s = e.find_state(k.key);
        DZR_CHECK(s != nullptr, "{}: action.{} is relative but there is no state.{} to add back", who, k.key, k.key);
        DZR_CHECK(s->dim == k.dim, "{}: action.{} is relative and {} wide but state.{} is {} wide", who, k.key, k.dim,
                  k.key, s->dim);
    }
}

// ---- writers ----------------------------------------------------------------------------------------------------

std::string experiment_conf_yaml(const Embodiment& e, const ModelConfig& model) {
    const auto [vh, vw] = embodiment_view_size(e, model);
    const int state_pad = e.max_state_dim > 0 ? e.max_state_dim : model.dit.max_state_dim;
    const int action_pad = e.max_action_dim > 0 ? e.max_action_dim : model.dit.action_dim;
    const int horizon = e.action_horizon > 0 ? e.action_horizon : model.dit.num_action_per_block;
    std::vector<std::string> video, state, action, relative;
    for (const auto& c : e.cameras) video.push_back("video." + c.key);
    for (const auto& k : e.state) state.push_back("state." + k.key);
    for (const auto& k : e.action) {
        action.push_back("action." + k.key);
        if (k.relative) relative.push_back(k.key);
    }
    std::vector<int> video_deltas, action_deltas;
    for (int i = 0; i <= horizon; ++i) video_deltas.push_back(i);
    for (int i = 0; i < horizon; ++i) action_deltas.push_back(i);
    const std::map<std::string, int>& table = e.projector_indices.empty() ? default_projector_indices() : e.projector_indices;

    YAML::Emitter y;
    y << YAML::BeginMap;
    y << YAML::Key << "eval_bf16" << YAML::Value << true;
    y << YAML::Key << "num_frames" << YAML::Value << model.num_frames;
    y << YAML::Key << "action_horizon" << YAML::Value << horizon;
    y << YAML::Key << "state_horizon" << YAML::Value << 1;
    y << YAML::Key << "max_state_dim" << YAML::Value << state_pad;
    y << YAML::Key << "max_action_dim" << YAML::Value << action_pad;
    y << YAML::Key << "relative_action" << YAML::Value << !relative.empty();
    y << YAML::Key << "relative_action_per_horizon" << YAML::Value << false;
    y << YAML::Key << "relative_action_keys" << YAML::Value << YAML::Flow << relative;
    y << YAML::Key << "tokenizer_path" << YAML::Value << "google/umt5-xxl";
    y << YAML::Key << "fps" << YAML::Value << YAML::BeginMap << YAML::Key << e.tag << YAML::Value << e.fps << YAML::EndMap;
    y << YAML::Key << "embodiment_tag_to_projector_index" << YAML::Value << YAML::BeginMap;
    for (const auto& [t, i] : table) y << YAML::Key << t << YAML::Value << i;
    y << YAML::EndMap;

    const char* modality_config = "groot.vla.data.dataset.ModalityConfig";
    y << YAML::Key << "modality_configs" << YAML::Value << YAML::BeginMap << YAML::Key << e.tag << YAML::Value
      << YAML::BeginMap;
    y << YAML::Key << "video" << YAML::Value << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value << modality_config
      << YAML::Key << "delta_indices" << YAML::Value << YAML::Flow << video_deltas << YAML::Key << "eval_delta_indices"
      << YAML::Value << YAML::Flow << e.video_eval_delta_indices << YAML::Key << "modality_keys" << YAML::Value << video
      << YAML::EndMap;
    y << YAML::Key << "state" << YAML::Value << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value << modality_config
      << YAML::Key << "delta_indices" << YAML::Value << YAML::Flow << std::vector<int>{0} << YAML::Key << "modality_keys"
      << YAML::Value << state << YAML::EndMap;
    y << YAML::Key << "action" << YAML::Value << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value
      << modality_config << YAML::Key << "delta_indices" << YAML::Value << YAML::Flow << action_deltas << YAML::Key
      << "modality_keys" << YAML::Value << action << YAML::EndMap;
    y << YAML::EndMap << YAML::EndMap;

    const std::string t = "groot.vla.data.transform.";
    auto simple = [&](const std::string& cls, const std::vector<std::string>& apply) {
        y << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value << t + cls << YAML::Key << "apply_to" << YAML::Value
          << apply << YAML::EndMap;
    };
    auto normalize = [&](const std::vector<ArraySpec>& keys, const std::vector<std::string>& apply, const char* group) {
        y << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value << t + "StateActionTransform" << YAML::Key
          << "apply_to" << YAML::Value << apply << YAML::Key << "normalization_modes" << YAML::Value << YAML::BeginMap;
        for (const auto& k : keys)
            if (k.norm != NormMode::None)
                y << YAML::Key << std::string(group) + "." + k.key << YAML::Value << std::string(norm_mode_name(k.norm));
        y << YAML::EndMap << YAML::EndMap;
    };
    y << YAML::Key << "transforms" << YAML::Value << YAML::BeginMap << YAML::Key << e.tag << YAML::Value << YAML::BeginMap;
    y << YAML::Key << "_target_" << YAML::Value << t + "ComposedModalityTransform";
    y << YAML::Key << "transforms" << YAML::Value << YAML::BeginSeq;
    simple("VideoToTensor", video);
    y << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value << t + "VideoCrop" << YAML::Key << "apply_to"
      << YAML::Value << video << YAML::Key << "scale" << YAML::Value << e.crop_scale << YAML::Key << "mode" << YAML::Value
      << "random" << YAML::EndMap;
    y << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value << t + "VideoResize" << YAML::Key << "apply_to"
      << YAML::Value << video << YAML::Key << "height" << YAML::Value << vh << YAML::Key << "width" << YAML::Value << vw
      << YAML::Key << "interpolation" << YAML::Value << "linear" << YAML::EndMap;
    y << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value << t + "VideoColorJitter" << YAML::Key << "apply_to"
      << YAML::Value << video << YAML::Key << "brightness" << YAML::Value << 0.3 << YAML::Key << "contrast" << YAML::Value
      << 0.4 << YAML::Key << "saturation" << YAML::Value << 0.5 << YAML::Key << "hue" << YAML::Value << 0.08
      << YAML::EndMap;
    simple("VideoToNumpy", video);
    simple("StateActionToTensor", state);
    normalize(e.state, state, "state");
    simple("StateActionToTensor", action);
    normalize(e.action, action, "action");
    y << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value << t + "ConcatTransform" << YAML::Key
      << "video_concat_order" << YAML::Value << video << YAML::Key << "state_concat_order" << YAML::Value << state
      << YAML::Key << "action_concat_order" << YAML::Value << action << YAML::EndMap;
    y << YAML::BeginMap << YAML::Key << "_target_" << YAML::Value
      << "groot.vla.model.dreamzero.transform.dreamzero_cotrain.DreamTransform" << YAML::Key << "default_instruction"
      << YAML::Value << "Perform the default behavior." << YAML::Key << "language_dropout_prob" << YAML::Value << 0.0
      << YAML::Key << "always_use_default_instruction" << YAML::Value << false << YAML::Key << "max_state_dim"
      << YAML::Value << state_pad << YAML::Key << "max_action_dim" << YAML::Value << action_pad << YAML::Key
      << "max_length" << YAML::Value << model.t5.text_len << YAML::Key << "state_horizon" << YAML::Value << 1
      << YAML::Key << "action_horizon" << YAML::Value << horizon << YAML::Key << "embodiment_tag_mapping" << YAML::Value
      << YAML::BeginMap;
    for (const auto& [tag, i] : table) y << YAML::Key << tag << YAML::Value << i;
    y << YAML::EndMap << YAML::Key << "tokenizer_path" << YAML::Value << "google/umt5-xxl" << YAML::EndMap;
    y << YAML::EndSeq << YAML::EndMap << YAML::EndMap;
    y << YAML::EndMap;
    return fmt::format("# experiment_cfg/conf.yaml of a random checkpoint (dzr ckpt make --embodiment {}): the parts of\n"
                       "# the resolved training config that the policy reads, in the official layout.\n{}\n",
                       e.tag, y.c_str());
}

std::string synthetic_metadata_json(const Embodiment& e) {
    json state = json::object(), action = json::object(), video = json::object();
    json state_mod = json::object(), action_mod = json::object();
    for (const auto& k : e.state) {
        state[k.key] = synthetic_key_stats(k, false);
        state_mod[k.key] = {{"absolute", true}, {"continuous", true}, {"shape", {k.dim}}};
    }
    for (const auto& k : e.action) {
        action[k.key] = synthetic_key_stats(k, true);
        action_mod[k.key] = {{"absolute", !k.relative}, {"continuous", true}, {"shape", {k.dim}}};
    }
    for (const auto& c : e.cameras) {
        const int h = c.height > 0 ? c.height : 480, w = c.width > 0 ? c.width : 640;
        video[c.key] = {{"resolution", {w, h}}, {"channels", 3}, {"fps", e.fps > 0 ? e.fps : 15.0}};
    }
    const json root = {{e.tag,
                        {{"statistics", {{"state", state}, {"action", action}}},
                         {"modalities", {{"video", video}, {"state", state_mod}, {"action", action_mod}}},
                         {"embodiment_tag", e.tag}}}};
    return root.dump(2) + "\n";
}

}  // namespace dzr
