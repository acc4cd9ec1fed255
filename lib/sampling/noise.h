#pragma once
/// Initial noise of a denoising call. The reference draws video noise [1, 16, 2, 44, 80] and action
/// noise [1, 24, 32] from a fresh CUDA generator seeded 1140 on every call, so every call starts from
/// the same noise. CUDA's Philox stream cannot be reproduced outside PyTorch, so dzr has its own
/// seeded generator (defined in docs/SAMPLING.md) and, for parity runs, noise injected from files.
///
/// Generator: element i of a stream is normal number i%4 of block b = i/4, where block b is
/// Philox4x32-10(counter = {lo(b), hi(b), lo(stream), hi(stream)}, key = {lo(seed), hi(seed)})
/// -> (u0, u1, u2, u3); (u0, u1) and (u2, u3) each give two normals by Box-Muller in double:
/// U = (u + 0.5) / 2^32, r = sqrt(-2 ln U_a), z = (r cos 2 pi U_b, r sin 2 pi U_b), rounded to f32.
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace dzr {

inline constexpr uint64_t kDreamZeroSeed = 1140;
/// Video noise [C, T, H, W] in the reference's generation order (its [1, 16, 2, 44, 80] minus batch).
inline const Shape kVideoNoiseShape{16, 2, 44, 80};
/// Action noise [horizon, action_dim] (the reference's [1, 24, 32] minus batch).
inline const Shape kActionNoiseShape{24, 32};

/// One Philox4x32-10 block: counter and key as 32-bit words.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

/// Fill `out` with standard normal f32 numbers [offset, offset + out.size()) of (seed, stream).
void philox_normal_fill(uint64_t seed, uint64_t stream, std::span<float> out, uint64_t offset = 0);

enum class NoiseKind : uint8_t { Video, Action };

/// Supplies the initial noise of each denoising call as host f32 values.
class NoiseSource {
  public:
    virtual ~NoiseSource() = default;
    /// Write the noise of `kind` for call `call_index` (0-based) into `out` (shape.numel() values).
    /// Throws dzr::Error when the source cannot supply that shape.
    virtual void fill(NoiseKind kind, int64_t call_index, const Shape& shape, std::span<float> out) = 0;
    /// True when every call gets the same noise, so a caller may upload it once and reuse it.
    virtual bool same_every_call() const = 0;
    /// One line for logs and run manifests ("philox seed 1140", "fixed noise from ...").
    virtual std::string describe() const = 0;
};

/// dzr's seeded generator. Video and action both use stream 0 of the same seed, mirroring the
/// reference's fresh generator per tensor (so the action noise equals the first 768 video values,
/// as a fresh same-seed generator gives a common prefix). Same noise every call.
class SeededNoise final : public NoiseSource {
  public:
    explicit SeededNoise(uint64_t seed = kDreamZeroSeed) : seed_(seed) {}
    void fill(NoiseKind kind, int64_t call_index, const Shape& shape, std::span<float> out) override;
    bool same_every_call() const override { return true; }
    std::string describe() const override;

  private:
    uint64_t seed_;
};

/// Noise given as values (e.g. dumped from the reference): the same tensors for every call. Shapes
/// must match what is asked, ignoring leading 1s (a dumped [1, 16, 2, 44, 80] serves [16, 2, 44, 80]).
class FixedNoise final : public NoiseSource {
  public:
    FixedNoise(Shape video_shape, std::vector<float> video, Shape action_shape, std::vector<float> action,
               std::string origin = "in-memory values");
    void fill(NoiseKind kind, int64_t call_index, const Shape& shape, std::span<float> out) override;
    bool same_every_call() const override { return true; }
    std::string describe() const override { return "fixed noise from " + origin_; }

  private:
    Shape video_shape_, action_shape_;
    std::vector<float> video_, action_;
    std::string origin_;
};

/// Generate the noise of `kind` for `call_index` on the host and upload it into `dst` (converting to
/// dst's dtype, i.e. rounding to the compute dtype). dst must be contiguous.
void upload_noise(Backend& be, NoiseSource& source, NoiseKind kind, int64_t call_index,
                  const TensorView& dst);

}  // namespace dzr
