#include "model/rope.h"

#include <cmath>

#include "core/error.h"

namespace dzr {
namespace {

/// cos and sin of `angle` as double-float pairs (hi = the f32 rounding, lo = the f32 rounding of the rest):
/// hi + lo carries ~48 bits, so the backends can rotate in double as the reference does (complex128).
void put_pair(float* row, int pair, double angle) {
    const double c = std::cos(angle), s = std::sin(angle);
    float* e = row + size_t(kRopeEntry) * size_t(pair);
    e[0] = float(c);
    e[1] = float(c - double(e[0]));
    e[2] = float(s);
    e[3] = float(s - double(e[2]));
}

void check_head_dim(int head_dim) {
    DZR_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be positive and even, got {}",
              head_dim);
}

}  // namespace

VideoRopeSplit video_rope_split(int head_dim) {
    check_head_dim(head_dim);
    const int hw_dims = 2 * (head_dim / 6);
    const int t_dims = head_dim - 2 * hw_dims;
    DZR_CHECK(t_dims % 2 == 0 && hw_dims > 0, "rope: head_dim {} gives an odd temporal band", head_dim);
    return {t_dims / 2, hw_dims / 2, hw_dims / 2};
}

double rope_frequency(int pair, int dims, double theta) {
    return 1.0 / std::pow(theta, double(2 * pair) / double(dims));
}

std::vector<float> video_rope_table(int head_dim, int first_frame, int frames, int grid_h, int grid_w) {
    const VideoRopeSplit s = video_rope_split(head_dim);
    const int pairs = head_dim / 2;
    const int t_dims = 2 * s.t_pairs, hw_dims = 2 * s.h_pairs;
    std::vector<float> table(size_t(frames) * grid_h * grid_w * pairs * kRopeEntry);
    size_t token = 0;
    for (int fi = 0; fi < frames; ++fi)
        for (int hi = 0; hi < grid_h; ++hi)
            for (int wi = 0; wi < grid_w; ++wi, ++token) {
                float* row = &table[token * pairs * kRopeEntry];
                for (int j = 0; j < s.t_pairs; ++j)
                    put_pair(row, j, double(first_frame + fi) * rope_frequency(j, t_dims));
                for (int j = 0; j < s.h_pairs; ++j)
                    put_pair(row, s.t_pairs + j, double(hi) * rope_frequency(j, hw_dims));
                for (int j = 0; j < s.w_pairs; ++j)
                    put_pair(row, s.t_pairs + s.h_pairs + j, double(wi) * rope_frequency(j, hw_dims));
            }
    return table;
}

std::vector<float> register_rope_table(int head_dim, int block_index, int num_action, int num_state) {
    check_head_dim(head_dim);
    const int pairs = head_dim / 2;
    std::vector<float> table(size_t(num_action + num_state) * pairs * kRopeEntry);
    for (int r = 0; r < num_action + num_state; ++r) {
        // NOTE: actions and states index separate position tables (freqs_action, freqs_state).
        const int64_t pos = r < num_action ? int64_t(block_index) * num_action + r
                                           : int64_t(block_index) * num_state + (r - num_action);
        for (int j = 0; j < pairs; ++j)
            put_pair(&table[size_t(r) * pairs * kRopeEntry], j, double(pos) * rope_frequency(j, head_dim));
    }
    return table;
}

DitRopeTables::DitRopeTables(Backend& be, int head_dim, int grid_h, int grid_w, int max_frames,
                             int max_block_index, int num_action, int num_state)
    : frame_tokens_(grid_h * grid_w), max_frames_(max_frames), max_block_index_(max_block_index) {
    DZR_CHECK(grid_h > 0 && grid_w > 0 && max_frames > 0 && max_block_index >= 0,
              "rope: invalid table geometry (grid {}x{}, {} frames, block index up to {})", grid_h, grid_w,
              max_frames, max_block_index);
    const int pairs = head_dim / 2;
    std::vector<float> v = video_rope_table(head_dim, 0, max_frames, grid_h, grid_w);
    video_ = be.alloc(Shape{int64_t(max_frames) * frame_tokens_, pairs, kRopeEntry}, DType::F32);
    be.upload(TensorView(v.data(), DType::F32, video_.shape()), video_);

    const int regs = num_action + num_state;
    std::vector<float> r;
    r.reserve(size_t(max_block_index + 1) * regs * pairs * kRopeEntry);
    for (int k = 0; k <= max_block_index; ++k) {
        const std::vector<float> rk = register_rope_table(head_dim, k, num_action, num_state);
        r.insert(r.end(), rk.begin(), rk.end());
    }
    registers_ = be.alloc(Shape{max_block_index + 1, regs, pairs, kRopeEntry}, DType::F32);
    be.upload(TensorView(r.data(), DType::F32, registers_.shape()), registers_);
}

TensorView DitRopeTables::video(int start_frame, int frames) const {
    DZR_CHECK(start_frame >= 0 && frames > 0 && start_frame + frames <= max_frames_,
              "causal dit: RoPE start frame {} with {} frames is outside the precomputed window of {} latent "
              "frames",
              start_frame, frames, max_frames_);
    return video_.view().slice(0, int64_t(start_frame) * frame_tokens_, int64_t(frames) * frame_tokens_);
}

TensorView DitRopeTables::registers(int block_index) const {
    DZR_CHECK(block_index >= 0 && block_index <= max_block_index_,
              "causal dit: register RoPE block index {} is outside the precomputed range [0, {}]",
              block_index, max_block_index_);
    const TensorView all = registers_.view();
    // [K, R, D/2, 4] -> [R, D/2, 4] for one block index
    return all.slice(0, block_index, 1).reshape(Shape{all.dim(1), all.dim(2), all.dim(3)});
}

}  // namespace dzr
