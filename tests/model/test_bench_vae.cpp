// `dzr bench vae` on the CPU at the tiny config: it prints both encodes' times and, in fast numerics, the
// difference to reference numerics (zero on the CPU, whose two numerics are one f32 computation), and with --profile
// a per-op table; bad options are one message each.
#include <doctest/doctest.h>

#include "support/cli.h"
#include "support/test_support.h"

using namespace dzr;

TEST_CASE("dzr bench vae times the clip and ys encodes of the tiny config on the CPU and compares the numerics") {
    if (test::dzr_bin().empty()) return;
    test::TempDir dir;
    const std::string cfg = test::q(test::source_dir() / "configs/tiny.yaml");
    auto r = test::run_dzr("bench vae --device cpu --warmup 0 --repeats 1 --config " + cfg, dir.path());
    CAPTURE(r.out);
    CAPTURE(r.err);
    CHECK(r.code == 0);
    CHECK(r.has("clip encode (9 frames -> 3 latent, eager)"));
    CHECK(r.has("ys encode (33 frames, autocast)"));
    CHECK(r.has("fast vs reference numerics, clip latent: max abs 0 "));
    CHECK(r.has("fast vs reference numerics, ys:          max abs 0 "));
    CHECK(!r.has("per-op profile"));

    // --profile: the per-op table of both encodes
    r = test::run_dzr("bench vae --device cpu --warmup 0 --repeats 1 --no-compare --profile --config " + cfg,
                      dir.path());
    CAPTURE(r.out);
    CHECK(r.code == 0);
    CHECK(r.has("per-op profile (1 clip and 1 ys encodes"));
    CHECK(r.has("-- clip_encode: top ops by time"));
    CHECK(r.has("-- ys_encode: top ops by time"));
    CHECK(r.has("conv3d"));

    r = test::run_dzr("bench vae --device cpu --numerics quick --config " + cfg, dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("unknown numerics 'quick'"));
    r = test::run_dzr("bench vae --device cpu --config " + test::q(dir / "missing.yaml"), dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("missing.yaml"));
}
