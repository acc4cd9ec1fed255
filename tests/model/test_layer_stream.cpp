// DiT layers streamed from host memory (offload_layers, model/layer_stream.h): the layers chosen, the actions bit for
// bit those of resident layers in both numerics (the window's cross-K/V passes copy only the projections they read),
// and every tensor of a streamed layer moved into its slot.
// NOTE: on the micro geometry with 4 DiT layers, so 3 streamed layers take turns in the 2 slots.
#include <doctest/doctest.h>

#include <memory>

#include "backend/backend.h"
#include "config/run_config.h"
#include "model/causal_dit.h"
#include "model/inventory.h"
#include "model/layer_stream.h"
#include "policy/dreamzero_policy.h"
#include "policy/normalization.h"
#include "support/micro_geometry.h"
#include "support/random_world.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/keys.h"
#include "weights/random_checkpoint.h"

using namespace dzr;

namespace {

/// The micro geometry with 4 DiT layers.
struct World : test::RandomWorld {
    World() : RandomWorld(geometry(), 5) {}
    static std::vector<config::Override> geometry() {
        std::vector<config::Override> o = test::micro_geometry();
        o.push_back({"model.dit.num_layers", "4"});
        return o;
    }
    std::unique_ptr<DreamZeroPolicy> policy(Backend& be, int offload_layers) const {
        PolicyOptions o = options();
        o.offload_layers = offload_layers;
        return std::make_unique<DreamZeroPolicy>(ckpt->model_config(), *ckpt, droid(), tokenizer(), o,
                                                 Placement{{&be}});
    }
};

/// Actions of 7 calls with frames that differ per call (a window reset at call 4: the cross passes run again).
std::vector<std::vector<float>> run_calls(DreamZeroPolicy& policy) {
    std::vector<std::vector<float>> out;
    for (int call = 0; call < 7; ++call) {
        const test::DroidCall in(
            call == 0 ? 1 : 4,
            [&](size_t i, int c) { return uint8_t((i * 13 + size_t(call) * 29 + size_t(c) * 7) % 253); },
            [&](int j) { return 0.04 * j - 0.1 + 0.03 * call; }, 0.3, "Stack the blocks");
        out.push_back(policy.step(in.obs).actions);
    }
    return out;
}

}  // namespace

TEST_CASE("the streamed layers are spread over the DiT") {
    CHECK(streamed_layers(40, 0).empty());
    CHECK(streamed_layers(40, 5) == std::vector<int>{6, 13, 20, 26, 33});
    CHECK(streamed_layers(4, 3) == std::vector<int>{1, 2, 3});
    CHECK(streamed_layers(4, 4) == std::vector<int>{0, 1, 2, 3});
    CHECK(streamed_layers(40, 40).back() == 39);
    CHECK_THROWS_WITH(streamed_layers(40, 41), doctest::Contains("offload_layers 41 is outside [0, 40]"));
    CHECK_THROWS(streamed_layers(40, -1));
}

TEST_CASE("DiT layers streamed from host memory give the actions of resident layers bit for bit") {
    World world;
    for (Numerics numerics : {Numerics::Reference, Numerics::Fast}) {
        CAPTURE(numerics_name(numerics));
        BackendOptions bo;
        bo.numerics = numerics;
        std::vector<std::vector<float>> expected;
        for (int offload : {0, 1, 3, 4}) {
            CAPTURE(offload);
            auto be = make_backend(Device::cpu(), bo);
            auto policy = world.policy(*be, offload);
            const LayerStream& ls = policy->engine().dit().layer_stream();
            CHECK(ls.count() == offload);
            const auto got = run_calls(*policy);
            if (offload == 0) {
                expected = got;
                continue;
            }
            REQUIRE(got.size() == expected.size());
            for (size_t c = 0; c < got.size(); ++c) {
                CAPTURE(c);
                CHECK(got[c] == expected[c]);
            }
        }
    }
}

TEST_CASE("a streamed layer keeps all of its tensors in its slot") {
    World world;
    auto be = make_cpu_backend();
    auto policy = world.policy(*be, 3);
    const LayerStream& ls = policy->engine().dit().layer_stream();
    REQUIRE(ls.count() == 3);
    // every weight of a block, each at a 256-byte boundary (the CPU's f32): a tensor missing from the layout would
    // stay where it was loaded
    uint64_t block = 0;
    const std::string prefix = keys::dit_block(0);
    for (const ExpectedWeight& w : expected_weights(world.ckpt->model_config()))
        if (w.key.compare(0, prefix.size(), prefix) == 0) block += (uint64_t(w.shape.numel()) * 4 + 255) / 256 * 256;
    CHECK(ls.host_bytes() == 3 * block);
    CHECK(ls.slot_bytes() == size_t(LayerStream::kSlots) * block);
}
