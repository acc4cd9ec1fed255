#include "policy/observation.h"

#include "core/error.h"
#include "core/timer.h"
#include "policy/tokenizer.h"

namespace dzr {

namespace {
constexpr int kMaxClipFrames = 9;  // the VAE clip of a commit call: [f0, f0, f0, f1, f1, f2, f2, f3, f3]
}  // namespace

std::vector<int> commit_clip_indices(int T, int frames_per_block) {
    std::vector<int> idx;
    if ((T - 1) / 4 == frames_per_block) {  // T = 9: as is
        for (int t = 0; t < T; ++t) idx.push_back(t);
    } else if (T / 4 != frames_per_block) {  // T = 4: each frame twice, the first prepended
        const int repeat = frames_per_block / (T / 4);
        idx.push_back(0);
        for (int t = 0; t < T; ++t)
            for (int r = 0; r < repeat; ++r) idx.push_back(t);
    } else {  // T = 8: the first prepended
        idx.push_back(0);
        for (int t = 0; t < T; ++t) idx.push_back(t);
    }
    return idx;
}

Observation droid_observation(const TensorView& exterior_1, const TensorView& exterior_2, const TensorView& wrist,
                              std::span<const double> joint_position, double gripper_position, std::string prompt) {
    Observation obs;
    obs.views = {exterior_1, exterior_2, wrist};
    obs.state.assign(joint_position.begin(), joint_position.end());
    obs.state.push_back(gripper_position);
    obs.prompt = std::move(prompt);
    return obs;
}

PreparedObservation prepare_observation(const Observation& obs, const ModelConfig& model, const Embodiment& embodiment,
                                        const ObservationPreprocessor& preprocessor, const Umt5Tokenizer& tokenizer,
                                        bool bf16_inputs, PreparedObservation* reuse) {
    Timer timer;
    DZR_CHECK(obs.views.size() == embodiment.cameras.size(),
              "observation: {} camera streams, embodiment {} has {} cameras", obs.views.size(), embodiment.tag,
              embodiment.cameras.size());
    const int T = int(obs.views[0].rank() == 4 ? obs.views[0].dim(0) : 0);
    for (size_t c = 0; c < obs.views.size(); ++c) {
        const TensorView& v = obs.views[c];
        DZR_CHECK(v.rank() == 4 && v.dtype == DType::U8 && v.dim(3) == 3 && v.is_contiguous(),
                  "observation: camera {} frames must be uint8 [T, H, W, 3], got {}", embodiment.cameras[c].key, v.str());
        DZR_CHECK(v.dim(0) == T, "observation: cameras carry different frame counts ({} vs {})", v.dim(0), T);
    }
    DZR_CHECK(T == 1 || T == 4 || T == 8 || T == 9, "observation: {} frames per camera; a call takes 1, 4, 8 or 9", T);
    DZR_CHECK(!obs.prompt.empty(), "observation: empty prompt");
    DZR_CHECK(obs.state.size() == size_t(embodiment.state_dim()), "observation: {} state values, embodiment {} has {}",
              obs.state.size(), embodiment.tag, embodiment.state_dim());
    DZR_CHECK(embodiment.prompt.has_value(), "observation: embodiment {} has no prompt template", embodiment.tag);
    DZR_CHECK(preprocessor.spec().canvas_height() == model.canvas_height &&
                  preprocessor.spec().canvas_width() == model.canvas_width,
              "observation: the preprocessor makes {}x{} canvases but the model's canvas is {}x{}",
              preprocessor.spec().canvas_height(), preprocessor.spec().canvas_width(), model.canvas_height,
              model.canvas_width);

    PreparedObservation p;
    if (reuse) p = std::move(*reuse);
    p.frames = T;
    p.state = obs.state;
    // Views -> canvases -> the two possible model inputs (host); step() uploads the one its reset
    // decision needs.
    const size_t frame_values = size_t(3) * model.canvas_height * model.canvas_width;
    const int ref = (T == 4 || T == 9) ? T - 1 : 0;
    std::vector<int> clip;
    if (T > 1) {
        clip = commit_clip_indices(T, model.dit.num_frame_per_block);
        DZR_CHECK(int(clip.size()) == kMaxClipFrames, "observation: {} frames give a {}-frame clip", T, clip.size());
    }
    // NOTE: the unused dtype's inputs are emptied (capacity kept): step() uploads whichever is filled.
    if (bf16_inputs) {
        p.reference_input.clear();
        p.clip_input.clear();
        p.reference_input_bf16.resize(frame_values);
        p.clip_input_bf16.resize(frame_values * clip.size());
        preprocessor.run_bf16(obs.views, ref, clip, p.reference_input_bf16, p.clip_input_bf16, &p.canvas_scratch);
    } else {
        p.reference_input_bf16.clear();
        p.clip_input_bf16.clear();
        p.reference_input.resize(frame_values);
        p.clip_input.resize(frame_values * clip.size());
        preprocessor.run(obs.views, ref, clip, p.reference_input, p.clip_input, &p.canvas_scratch);
    }
    p.tokens = tokenize_prompts(tokenizer, *embodiment.prompt, obs.prompt, model.t5.text_len);
    p.prepare_ms = timer.ms();
    return p;
}

}  // namespace dzr
