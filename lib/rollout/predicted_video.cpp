#include "rollout/predicted_video.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"

namespace dzr::rollout {

namespace {
// Decoded frames per latent frame after the first (the Wan VAE's temporal factor).
constexpr int kFramesPerLatent = 4;
}  // namespace

std::vector<int64_t> observed_frame_indices(bool opens_stream, bool with_reference, int64_t reference_frame,
                                            std::span<const int64_t> next_frames, int predicted_latents) {
    DZR_CHECK(!opens_stream || with_reference, "video: the first prediction of a stream must carry the reference latent");
    DZR_CHECK(predicted_latents >= 0, "video: {} predicted latents", predicted_latents);
    DZR_CHECK(predicted_latents == 0 || !next_frames.empty(), "video: no frames stand for the predicted latents");
    std::vector<int64_t> out;
    if (with_reference) out.insert(out.end(), opens_stream ? 1 : kFramesPerLatent, reference_frame);
    const int64_t slots = int64_t(predicted_latents) * kFramesPerLatent;
    const int64_t n = int64_t(next_frames.size());
    for (int64_t s = 0; s < slots; ++s) out.push_back(next_frames[size_t(s * n / slots)]);
    return out;
}

void VideoAccumulator::add(const Tensor& latent, std::span<const int64_t> observed) {
    DZR_CHECK(latent.dtype() == DType::F32 && latent.shape().rank() == 4 && latent.device().is_cpu(),
              "video: a prediction must be host f32 [z, f, h, w], got {}", latent.view().str());
    if (!chunks_.empty()) {
        const Shape& a = chunks_.front().shape();
        const Shape& b = latent.shape();
        DZR_CHECK(a[0] == b[0] && a[2] == b[2] && a[3] == b[3], "video: prediction {} does not match earlier ones ({})",
                  latent.view().str(), chunks_.front().view().str());
    }
    chunks_.push_back(latent);
    latent_frames_ += latent.shape()[1];
    observed_.insert(observed_.end(), observed.begin(), observed.end());
}

Tensor VideoAccumulator::joined() const {
    DZR_CHECK(!chunks_.empty(), "video: no predictions to join");
    const Shape& s0 = chunks_.front().shape();
    const int64_t z = s0[0], plane = s0[2] * s0[3];
    Tensor out = Tensor::host(Shape{z, latent_frames_, s0[2], s0[3]}, DType::F32);
    // [z, f_i, h, w] per call -> [z, K, h, w]
    int64_t t0 = 0;
    for (const Tensor& c : chunks_) {
        const int64_t f = c.shape()[1];
        for (int64_t ch = 0; ch < z; ++ch)
            std::memcpy(out.ptr<float>() + (ch * latent_frames_ + t0) * plane, c.ptr<float>() + ch * f * plane,
                        size_t(f * plane) * sizeof(float));
        t0 += f;
    }
    return out;
}

Tensor observed_canvases(const io::Episode& ep, std::span<const int64_t> frames, const CanvasSpec& spec) {
    const int64_t H = spec.canvas_height(), W = spec.canvas_width();
    DZR_CHECK(ep.cameras.size() == spec.cameras.size(), "video: episode {} has {} cameras, the canvas takes {}",
              ep.name, ep.cameras.size(), spec.cameras.size());
    Tensor out = Tensor::host(Shape{int64_t(frames.size()), H, W, 3}, DType::U8);
    const size_t frame_bytes = size_t(H * W * 3);
    std::map<int64_t, RgbImage> cache;
    for (size_t i = 0; i < frames.size(); ++i) {
        const int64_t f = frames[i];
        DZR_CHECK(f >= 0 && f < ep.num_frames, "video: frame {} is outside the episode ({} frames)", f, ep.num_frames);
        auto it = cache.find(f);
        if (it == cache.end()) {
            std::vector<RgbImage> views;
            for (size_t c = 0; c < ep.cameras.size(); ++c)
                views.push_back(preprocess_view(frame_view(ep.cameras[c].frames, f), spec, spec.cameras[c]));
            it = cache.emplace(f, compose_canvas(spec.layout, views)).first;
        }
        DZR_ASSERT(it->second.pixels.size() == frame_bytes);
        std::memcpy(out.ptr<uint8_t>() + i * frame_bytes, it->second.pixels.data(), frame_bytes);
    }
    return out;
}

}  // namespace dzr::rollout
