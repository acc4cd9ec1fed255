// `dzr bench rollout`'s result: the DZR_* settings of the environment go into its JSON and its table, so a recorded
// number says which backend switches it ran under (docs/PERF.md records the commands).
#include <doctest/doctest.h>

#include <string>

#include "rollout/bench_rollout.h"

using namespace dzr;

TEST_CASE("a bench result records the environment's backend settings in its JSON and its table") {
    rollout::BenchRolloutResult r;
    r.devices = "cuda:0";
    r.numerics = "fast";
    CHECK(r.to_json()["environment"].empty());
    CHECK(r.table().find("environment:") == std::string::npos);
    r.environment = {{"DZR_GEMM_TUNE", "off"}, {"DZR_BATCHED_ATTENTION", "off"}};
    const nlohmann::ordered_json j = r.to_json();
    CHECK(j["environment"]["DZR_GEMM_TUNE"] == "off");
    CHECK(j["environment"]["DZR_BATCHED_ATTENTION"] == "off");
    CHECK(r.table().find("environment: DZR_GEMM_TUNE=off DZR_BATCHED_ATTENTION=off\n") != std::string::npos);
}
