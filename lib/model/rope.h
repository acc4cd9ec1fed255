#pragma once
/// Rotary position tables of the causal DiT (dreamzero-reference.md §2.5.4). Channel pairs are
/// interleaved (pair j = channels 2j, 2j+1) and rotated by pos·θ_j with θ_j = 10000^(−2j/dims) of
/// the band the pair belongs to. Tables are computed in float64 on the host and stored as f32
/// [L, head_dim/2, 2] (cos, sin), the layout Backend::rope expects.
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace dzr {

inline constexpr double kRopeTheta = 10000.0;

/// Pairs per band of the 3-D video RoPE of one head: temporal t = d − 4·(d/6) channels, rows and
/// columns 2·(d/6) channels each (22 / 21 / 21 pairs for head_dim 128).
struct VideoRopeSplit {
    int t_pairs = 0;
    int h_pairs = 0;
    int w_pairs = 0;
};
VideoRopeSplit video_rope_split(int head_dim);

/// θ of pair `pair` in a band of `dims` channels: 1 / theta^(2·pair / dims).
double rope_frequency(int pair, int dims, double theta = kRopeTheta);

/// Floats per (token, pair) entry of dzr's RoPE tables: cos and sin, each as a double-float (hi, lo) pair
/// (Backend::rope's double-precision table format: the reference rotates in complex128).
inline constexpr int kRopeEntry = 4;

/// Host f32 [frames·grid_h·grid_w, head_dim/2, 4] for video tokens in (frame, row, column) order;
/// the temporal position of frame fi is first_frame + fi.
std::vector<float> video_rope_table(int head_dim, int first_frame, int frames, int grid_h, int grid_w);

/// Host f32 [num_action + num_state, head_dim/2, 4] for the register tokens of block index k:
/// 1-D RoPE over all pairs (θ over head_dim) at position k·num_action + a for action token a and
/// k·num_state + s for state token s.
std::vector<float> register_rope_table(int head_dim, int block_index, int num_action, int num_state);

/// The RoPE tables one DiT geometry needs, uploaded to the backend once at load; forwards take
/// row views, never recompute.
class DitRopeTables {
  public:
    DitRopeTables() = default;
    /// Video rows for latent frames [0, max_frames); register rows for block indices
    /// [0, max_block_index].
    DitRopeTables(Backend& be, int head_dim, int grid_h, int grid_w, int max_frames, int max_block_index,
                  int num_action, int num_state);

    /// f32 [frames·grid_h·grid_w, head_dim/2, 2] for frames [start_frame, start_frame + frames).
    TensorView video(int start_frame, int frames) const;
    /// f32 [num_action + num_state, head_dim/2, 2] for block index k.
    TensorView registers(int block_index) const;

    int max_frames() const { return max_frames_; }
    int max_block_index() const { return max_block_index_; }

  private:
    Tensor video_;      // [max_frames · frame_tokens, D/2, 2]
    Tensor registers_;  // [max_block_index + 1, R, D/2, 2]
    int frame_tokens_ = 0;
    int max_frames_ = 0;
    int max_block_index_ = -1;
};

}  // namespace dzr
