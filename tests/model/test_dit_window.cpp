// One attention window of DiT forwards at the real spatial geometry (44x80 latent, 880 tokens per
// frame) with the tiny widths of configs/tiny.yaml, driven like the policy (dreamzero-reference.md
// §1.5): prefill at 0, then denoise at csf and commit at csf for csf = 1, 3, 5, 7. Runs through the
// library's dense KV cache and, side by side, through the test-local dense cache.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "config/run_config.h"
#include "kv/dense_self_attention_cache.h"
#include "model/causal_dit.h"
#include "support/test_support.h"
#include "unit/test_dit_support.h"

using namespace dzr;
using namespace dzr::test;

TEST_CASE("a window of prefill, denoise and commit forwards at 880 tokens per frame") {
    const config::RunConfig rc = config::load_run_config(source_dir() / "configs" / "tiny.yaml");
    // NOTE: tiny.yaml runs a 176x320 canvas; this test keeps the real 352x640 one (880 tokens per frame).
    ModelConfig m = rc.model;
    m.canvas_height = 352;
    m.canvas_width = 640;
    m.dit.frame_seqlen = 880;
    const DitConfig& c = m.dit;
    const int lat_h = m.canvas_height / 8, lat_w = m.canvas_width / 8;
    REQUIRE(c.frame_seqlen == 880);

    MapWeightSource src;
    fill_dit_weights(src, c, 2024);
    auto be = make_cpu_backend();
    WeightLoader loader(src, *be);
    const CausalDit dit(c, lat_h, lat_w, loader);
    CHECK(dit.grid_height() == 22);
    CHECK(dit.grid_width() == 40);

    const int image_tokens = 257;
    std::vector<float> clip = random_floats(size_t(image_tokens) * c.image_dim, 1);
    std::vector<float> text = random_floats(size_t(c.text_len) * c.text_dim, 2);
    DitCrossKv kv = dit.make_cross_kv(*be, image_tokens);
    dit.compute_cross_kv(*be, TensorView(clip.data(), DType::F32, Shape{image_tokens, c.image_dim}),
                         TensorView(text.data(), DType::F32, Shape{c.text_len, c.text_dim}), kv);

    const KvGeometry geo = KvGeometry::from_model(m, DType::F32, 1);
    DenseSelfAttentionCache lib_cache(*be, geo, rc.kv);
    DenseTestCache test_cache(c.num_layers, c.num_heads, c.dim / c.num_heads);

    const int A = c.num_action_per_block;
    auto forward = [&](int frames, int start, int64_t t, bool registers, bool commit, uint64_t seed) {
        const size_t plane = size_t(frames) * lat_h * lat_w;
        std::vector<float> x = random_floats(c.out_dim * plane, seed),
                           y = random_floats((c.in_dim - c.out_dim) * plane, seed + 1);
        std::vector<float> action = random_floats(size_t(A) * c.action_dim, seed + 2);
        std::vector<float> state = random_floats(size_t(c.max_state_dim), seed + 3);
        DitInputs in;
        in.x = TensorView(x.data(), DType::F32, Shape{c.out_dim, frames, lat_h, lat_w});
        in.y = TensorView(y.data(), DType::F32, Shape{c.in_dim - c.out_dim, frames, lat_h, lat_w});
        in.start_frame = start;
        in.timestep = t;
        if (registers)
            in.registers = DitRegisterInputs{TensorView(action.data(), DType::F32, Shape{A, c.action_dim}), t,
                                             TensorView(state.data(), DType::F32, Shape{1, c.max_state_dim})};
        std::vector<float> video[2], act[2];
        for (int i = 0; i < 2; ++i) {
            video[i].assign(c.out_dim * plane, NAN);
            act[i].assign(size_t(A) * c.action_dim, NAN);
        }
        const KvForwardSpec spec = commit ? KvForwardSpec{true, frames, 0} : KvForwardSpec::denoise(geo);
        lib_cache.begin(spec);
        dit.forward(*be, in, kv, lib_cache,
                    DitOutputs{TensorView(video[0].data(), DType::F32, in.x.shape),
                               TensorView(act[0].data(), DType::F32, Shape{A, c.action_dim})});
        if (commit)
            lib_cache.commit();
        else
            lib_cache.abort();  // a denoising forward ends without writing history
        test_cache.begin(commit);
        dit.forward(*be, in, kv, test_cache,
                    DitOutputs{TensorView(video[1].data(), DType::F32, in.x.shape),
                               TensorView(act[1].data(), DType::F32, Shape{A, c.action_dim})});
        if (commit) test_cache.commit();
        for (float v : video[0]) REQUIRE(std::isfinite(v));
        CHECK(rel_max_err(video[0], Vec(video[1].begin(), video[1].end())) < 1e-5);
        if (registers) {
            for (float v : act[0]) REQUIRE(std::isfinite(v));
            CHECK(rel_max_err(act[0], Vec(act[1].begin(), act[1].end())) < 1e-5);
        }
    };

    const int64_t F = c.frame_seqlen;
    forward(1, 0, 0, false, true, 10);  // prefill
    CHECK(lib_cache.committed_tokens() == F);
    for (int csf : {1, 3, 5, 7}) {
        CAPTURE(csf);
        if (csf > 1) {
            forward(2, csf - 2, 0, false, true, 20 + uint64_t(csf));  // commit the observed frames
            CHECK(lib_cache.committed_tokens() == csf * F);
            CHECK(test_cache.history_tokens() == csf * F);
        }
        forward(2, csf, 999, true, false, 40 + uint64_t(csf));  // one denoising step
        CHECK(test_cache.last_keys[0] == csf * F + 2 * F + A + 1);
        CHECK(lib_cache.committed_tokens() == csf * F);
    }
}
