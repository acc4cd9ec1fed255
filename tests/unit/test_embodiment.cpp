// Embodiment descriptions: the built-ins against the official data configs, the conf.yaml and metadata.json
// readers, the checks against a model, and the errors that name the key and the embodiment.
#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/embodiment.h"
#include "core/error.h"
#include "policy/normalization.h"
#include "policy/prompt.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<std::string> keys_of(const std::vector<ArraySpec>& v) {
    std::vector<std::string> out;
    for (const auto& k : v) out.push_back(k.key + "[" + std::to_string(k.dim) + "]" + (k.relative ? "r" : ""));
    return out;
}

std::vector<std::string> cameras_of(const Embodiment& e) {
    std::vector<std::string> out;
    for (const auto& c : e.cameras) out.push_back(c.key);
    return out;
}

/// An embodiment bound to its synthetic statistics, as `dzr ckpt make --embodiment` writes them.
Embodiment bound(const std::string& tag, const ModelConfig& model) {
    const Embodiment e = builtin_embodiment(tag);
    Embodiment back = parse_experiment_config(experiment_conf_yaml(e, model), "conf.yaml").at(tag);
    bind_metadata(back, parse_embodiment_metadata(synthetic_metadata_json(e), "metadata.json").at(tag), "metadata.json");
    return back;
}

void write_text(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
}

/// A conf.yaml in the shape of the official resolved config (base_48_wan_fine_aug_relative.yaml with
/// agibot_relative.yaml), with one key switched to mean_std and the training-only transforms present.
const char* kAgibotConf = R"(
relative_action: true
relative_action_per_horizon: false
relative_action_keys: [left_arm_joint_position, right_arm_joint_position]
max_state_dim: 64
fps: {yam: 30}
modality_configs:
  agibot:
    video: {delta_indices: [0, 1, 2], eval_delta_indices: [-3, -2, -1, 0],
            modality_keys: [video.top_head, video.hand_left, video.hand_right]}
transforms:
  agibot:
    _target_: groot.vla.data.transform.ComposedModalityTransform
    transforms:
    - {_target_: groot.vla.data.transform.VideoToTensor, apply_to: [video.top_head, video.hand_left, video.hand_right]}
    - {_target_: groot.vla.data.transform.VideoCrop, apply_to: [video.top_head], scale: 0.95, mode: random}
    - {_target_: groot.vla.data.transform.VideoResize, apply_to: [video.top_head], height: 176, width: 320, interpolation: linear}
    - {_target_: groot.vla.data.transform.VideoColorJitter, apply_to: [video.top_head], brightness: 0.3}
    - {_target_: groot.vla.data.transform.VideoToNumpy, apply_to: [video.top_head]}
    - {_target_: groot.vla.data.transform.StateActionToTensor, apply_to: [state.left_arm_joint_position]}
    - _target_: groot.vla.data.transform.StateActionTransform
      apply_to: [state.left_arm_joint_position, state.right_arm_joint_position]
      normalization_modes: {state.left_arm_joint_position: q99, state.right_arm_joint_position: mean_std}
    - _target_: groot.vla.data.transform.StateActionTransform
      apply_to: [action.left_arm_joint_position, action.right_arm_joint_position, action.robot_velocity]
      normalization_modes: {action.left_arm_joint_position: q99, action.right_arm_joint_position: q99,
                            action.robot_velocity: min_max}
    - _target_: groot.vla.data.transform.ConcatTransform
      video_concat_order: [video.top_head, video.hand_left, video.hand_right]
      state_concat_order: [state.left_arm_joint_position, state.right_arm_joint_position]
      action_concat_order: [action.left_arm_joint_position, action.right_arm_joint_position, action.robot_velocity]
    - _target_: groot.vla.model.dreamzero.transform.dreamzero_cotrain.DreamTransform
      max_state_dim: 64
      max_action_dim: 32
      state_horizon: 1
      action_horizon: 24
      embodiment_tag_mapping: {oxe_droid: 17, agibot: 26, yam: 32}
)";

}  // namespace

TEST_CASE("the built-in embodiments follow the official data configs") {
    const Embodiment droid = builtin_embodiment("oxe_droid");
    CHECK(cameras_of(droid) == std::vector<std::string>{"exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"});
    CHECK(droid.cameras[0].height == 180);
    CHECK(droid.cameras[0].width == 320);
    CHECK(keys_of(droid.state) == std::vector<std::string>{"joint_position[7]", "gripper_position[1]"});
    CHECK(keys_of(droid.action) == std::vector<std::string>{"joint_position[7]r", "gripper_position[1]"});
    CHECK(droid.layout == CanvasLayout::DroidWrist);
    CHECK(droid.projector_index == 17);
    CHECK(droid.prompt == PromptTemplate::Droid);
    CHECK(droid.zero_fill_missing_state);
    CHECK(droid.crop_scale == 0.95);

    const Embodiment agibot = builtin_embodiment("agibot");
    CHECK(cameras_of(agibot) == std::vector<std::string>{"top_head", "hand_left", "hand_right"});
    CHECK(agibot.layout == CanvasLayout::Grid);
    CHECK(agibot.state_dim() == 20);
    CHECK(agibot.action_dim() == 22);
    CHECK(keys_of(agibot.action).back() == "robot_velocity[2]");  // absolute: not in relative_action_keys
    for (size_t i = 0; i + 1 < agibot.action.size(); ++i) CHECK(agibot.action[i].relative);
    CHECK(agibot.projector_index == 26);
    CHECK(agibot.prompt == PromptTemplate::FourViewsHands);
    CHECK(agibot.video_eval_delta_indices == std::vector<int>{-3, -2, -1, 0});
    CHECK_FALSE(agibot.zero_fill_missing_state);

    const Embodiment yam = builtin_embodiment("yam");
    CHECK(cameras_of(yam) == std::vector<std::string>{"top_camera-images-rgb", "left_camera-images-rgb",
                                                      "right_camera-images-rgb"});
    CHECK(keys_of(yam.state) == std::vector<std::string>{"left_joint_pos[6]", "left_gripper_pos[1]",
                                                         "right_joint_pos[6]", "right_gripper_pos[1]"});
    for (const auto& k : yam.action) CHECK(k.relative);
    CHECK(yam.fps == 30.0);
    CHECK(yam.projector_index == 32);
    CHECK(yam.prompt == PromptTemplate::FourViewsYam);
    CHECK(yam.cameras[0].height == 0);  // the official code does not say: frames are taken as they come

    CHECK(contains(error_of([] { builtin_embodiment("franka"); }), "unknown embodiment 'franka'"));
}

TEST_CASE("prompt templates are chosen by projector index as the official collate() does") {
    const auto& table = default_projector_indices();
    CHECK(prompt_template_for(17, table) == PromptTemplate::Droid);
    CHECK(prompt_template_for(26, table) == PromptTemplate::FourViewsHands);
    CHECK(prompt_template_for(22, table) == PromptTemplate::FourViewsHands);  // xdof
    CHECK(prompt_template_for(32, table) == PromptTemplate::FourViewsYam);
    CHECK(prompt_template_for(24, table) == PromptTemplate::SingleViewHuman);  // gr1_unified
    CHECK(prompt_template_for(27, table) == PromptTemplate::SingleViewHuman);  // mecka_hands (= lapa's index)
    CHECK_FALSE(prompt_template_for(18, table).has_value());                   // oxe_fractal: none
    CHECK(templated_prompt(PromptTemplate::FourViewsYam, "Fold The Towel") ==
          "A multi-view video shows that a robot fold the towel The video is split into four views: The top-left "
          "view shows the top camera, the top-right view shows the right camera, the bottom-left view shows the left "
          "camera, and the bottom-right view is a black screen. The robot fold the towel");
    CHECK(templated_prompt(PromptTemplate::FourViewsHands, "'Pick'").rfind(
              "A multi-view video shows that a robot pick The video is split into four views: The top-left view shows "
              "the camera view from the robot's head",
              0) == 0);
    CHECK(templated_prompt(PromptTemplate::Droid, "Go") == droid_prompt("Go"));
}

TEST_CASE("conf.yaml gives cameras, keys, normalization modes, relative keys and the view size") {
    const auto all = parse_experiment_config(kAgibotConf, "conf.yaml");
    REQUIRE(all.count("agibot") == 1);
    const Embodiment& e = all.at("agibot");
    CHECK(cameras_of(e) == std::vector<std::string>{"top_head", "hand_left", "hand_right"});
    CHECK(e.layout == CanvasLayout::Grid);
    CHECK(e.view_height == 176);
    CHECK(e.view_width == 320);
    CHECK(e.crop_scale == 0.95);
    REQUIRE(e.state.size() == 2);
    CHECK(e.state[0].norm == NormMode::Q99);
    CHECK(e.state[1].norm == NormMode::MeanStd);
    REQUIRE(e.action.size() == 3);
    CHECK(e.action[0].relative);
    CHECK(e.action[1].relative);
    CHECK_FALSE(e.action[2].relative);
    CHECK(e.action[2].norm == NormMode::MinMax);
    CHECK(e.projector_index == 26);
    CHECK(e.video_eval_delta_indices == std::vector<int>{-3, -2, -1, 0});
    CHECK(e.action_horizon == 24);
    CHECK(e.fps == 0.0);  // not in the fps map: metadata.json's
    CHECK_FALSE(e.has_statistics);
}

TEST_CASE("conf.yaml transforms dzr does not reproduce are errors naming the embodiment and the transform") {
    std::string conf = kAgibotConf;
    const std::string jitter = "groot.vla.data.transform.VideoColorJitter";
    std::string bad = conf;
    bad.replace(bad.find(jitter), jitter.size(), "groot.vla.data.transform.VideoNormalize");
    std::string msg = error_of([&] { parse_experiment_config(bad, "conf.yaml"); });
    CHECK(contains(msg, "transforms.agibot.transforms[3]"));
    CHECK(contains(msg, "VideoNormalize is not reproduced"));

    bad = conf;
    bad.replace(bad.find("interpolation: linear"), 21, "interpolation: cubic");
    CHECK(contains(error_of([&] { parse_experiment_config(bad, "conf.yaml"); }), "interpolation 'cubic'"));

    bad = conf;
    bad.replace(bad.find("state.right_arm_joint_position: mean_std"), 40, "state.right_arm_joint_position: log");
    CHECK(contains(error_of([&] { parse_experiment_config(bad, "conf.yaml"); }), "normalization mode 'log'"));

    bad = conf;
    bad.replace(bad.find("relative_action_per_horizon: false"), 34, "relative_action_per_horizon: true");
    CHECK(contains(error_of([&] { parse_experiment_config(bad, "conf.yaml"); }), "per-horizon"));

    CHECK(contains(error_of([] { parse_experiment_config("a: [1, 2", "conf.yaml"); }), "invalid YAML"));
    CHECK(contains(error_of([] { parse_experiment_config("a: 1\n", "conf.yaml"); }), "no `transforms` map"));
}

TEST_CASE("a conf.yaml written for a built-in reads back as the same embodiment") {
    ModelConfig model;  // the real geometry
    for (const char* tag : {"oxe_droid", "agibot", "yam"}) {
        CAPTURE(tag);
        const Embodiment b = builtin_embodiment(tag);
        const Embodiment e = bound(tag, model);
        CHECK(cameras_of(e) == cameras_of(b));
        CHECK(keys_of(e.state) == keys_of(b.state));
        CHECK(keys_of(e.action) == keys_of(b.action));
        CHECK(e.layout == b.layout);
        CHECK(e.prompt == b.prompt);
        CHECK(e.projector_index == b.projector_index);
        CHECK(e.fps == b.fps);
        CHECK(e.view_height == model.canvas_height / 2);
        CHECK(e.has_statistics);
        CHECK_NOTHROW(check_embodiment(e, model));
    }
    // DROID through conf.yaml normalizes exactly as the built-in with the same statistics.
    const EmbodimentStatistics stats = parse_metadata_json(droid_metadata_json(), "metadata.json").at("oxe_droid");
    Embodiment via_conf = parse_experiment_config(experiment_conf_yaml(builtin_embodiment("oxe_droid"), model), "c")
                              .at("oxe_droid");
    bind_metadata(via_conf, parse_embodiment_metadata(droid_metadata_json(), "m").at("oxe_droid"), "m");
    const std::vector<double> raw = {0.3, -0.2, 0.1, -1.9, 0.4, 2.2, 0.9, 0.7};
    CHECK(prepare_state(raw, via_conf, 64) == prepare_state(raw, droid_embodiment(stats), 64));
}

TEST_CASE("metadata.json binds widths, statistics and resolutions, and names what is missing") {
    const Embodiment yam = builtin_embodiment("yam");
    auto md = parse_embodiment_metadata(synthetic_metadata_json(yam), "metadata.json").at("yam");
    Embodiment e = yam;
    bind_metadata(e, md, "metadata.json");
    CHECK(e.cameras[0].height == 480);  // [640, 480] is [width, height]
    CHECK(e.cameras[0].width == 640);
    CHECK(e.state[2].offset == 7);
    CHECK(e.state[2].stats.q01.size() == 6);

    auto missing = md;
    missing.statistics.state.erase("right_gripper_pos");
    missing.state_dims.erase("right_gripper_pos");
    e = yam;
    const std::string msg = error_of([&] { bind_metadata(e, missing, "metadata.json"); });
    CHECK(contains(msg, "embodiment yam"));
    CHECK(contains(msg, "state.right_gripper_pos"));

    auto wide = md;
    wide.state_dims["left_joint_pos"] = 7;  // the statistics say 6
    e = yam;
    CHECK(contains(error_of([&] { bind_metadata(e, wide, "metadata.json"); }),
                   "statistics of state.left_joint_pos have 6 values but the key is 7 wide"));
}

TEST_CASE("a checkpoint's embodiments: conf.yaml, built-ins, selection and its errors") {
    test::TempDir dir;
    const ModelConfig model;
    // No conf.yaml: metadata.json's tags with a built-in description.
    write_text(dir / "droid/experiment_cfg/metadata.json", droid_metadata_json());
    const CheckpointEmbodiments droid = load_checkpoint_embodiments(dir / "droid");
    REQUIRE(droid.embodiments.size() == 1);
    CHECK(droid.embodiments[0].source == "built-in");
    CHECK(select_embodiment(droid, "", model).tag == "oxe_droid");
    std::string msg = error_of([&] { select_embodiment(droid, "franka", model); });
    CHECK(contains(msg, "unknown embodiment 'franka'"));
    CHECK(contains(msg, "carries oxe_droid"));

    // Two embodiments with statistics: the tag is needed.
    const Embodiment agibot = builtin_embodiment("agibot"), yam = builtin_embodiment("yam");
    nlohmann::json both = nlohmann::json::parse(synthetic_metadata_json(agibot));
    both.update(nlohmann::json::parse(synthetic_metadata_json(yam)));
    write_text(dir / "two/experiment_cfg/metadata.json", both.dump());
    const CheckpointEmbodiments two = load_checkpoint_embodiments(dir / "two");
    CHECK(contains(error_of([&] { select_embodiment(two, "", model); }), "several embodiments (agibot, yam)"));
    CHECK(select_embodiment(two, "yam", model).state_dim() == 14);

    // conf.yaml describes agibot, metadata.json lacks a key it normalizes.
    write_text(dir / "conf/experiment_cfg/conf.yaml", experiment_conf_yaml(agibot, model));
    nlohmann::json md = nlohmann::json::parse(synthetic_metadata_json(agibot));
    md["agibot"]["statistics"]["action"].erase("robot_velocity");
    md["agibot"]["modalities"]["action"].erase("robot_velocity");
    write_text(dir / "conf/experiment_cfg/metadata.json", md.dump());
    msg = error_of([&] { select_embodiment(load_checkpoint_embodiments(dir / "conf"), "agibot", model); });
    CHECK(contains(msg, "embodiment agibot"));
    CHECK(contains(msg, "action.robot_velocity"));

    // metadata.json without the described tag; no metadata.json at all.
    write_text(dir / "conf/experiment_cfg/metadata.json", synthetic_metadata_json(yam));
    msg = error_of([&] { select_embodiment(load_checkpoint_embodiments(dir / "conf"), "agibot", model); });
    CHECK(contains(msg, "has no statistics for embodiment agibot"));  // yam's are there, agibot's are not
    fs::remove(dir / "conf/experiment_cfg/metadata.json");
    CHECK(contains(error_of([&] { select_embodiment(load_checkpoint_embodiments(dir / "conf"), "agibot", model); }),
                   "experiment_cfg/metadata.json is missing"));
}

TEST_CASE("an embodiment that does not fit the model is refused, naming the key and the embodiment") {
    ModelConfig model;
    Embodiment e = bound("agibot", model);
    CHECK_NOTHROW(check_embodiment(e, model));

    Embodiment wide = e;
    wide.state[0].dim = 60;  // 60 + 13 > 64
    wide.state[0].stats.q01.resize(60, 0.f);
    wide.state[0].stats.q99.resize(60, 1.f);
    CHECK(contains(error_of([&] { check_embodiment(wide, model); }), "embodiment agibot: the state is 73 wide"));

    Embodiment no_state = e;
    no_state.state.erase(no_state.state.begin());  // left_arm_joint_position
    CHECK(contains(error_of([&] { check_embodiment(no_state, model); }),
                   "action.left_arm_joint_position is relative but there is no state.left_arm_joint_position"));

    Embodiment scale = e;
    scale.action.back().norm = NormMode::Scale;
    CHECK(contains(error_of([&] { check_embodiment(scale, model); }), "action.robot_velocity is normalized with `scale`"));

    ModelConfig other = model;
    other.canvas_height = 176;
    other.canvas_width = 320;  // the conf.yaml's VideoResize makes 176x320 views: a 352x640 canvas
    CHECK(contains(error_of([&] { check_embodiment(e, other); }), "the model's canvas is 176x320"));

    Embodiment other_pad = e;
    other_pad.max_state_dim = 44;
    CHECK(contains(error_of([&] { check_embodiment(other_pad, model); }), "pads the state to 44"));
}
