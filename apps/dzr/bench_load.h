#pragma once
/// `dzr bench load`: times loading a checkpoint's weights onto a device the way Engine does (the four
/// networks built over one WeightLoader), through the bulk path (parallel reads into pinned staging,
/// weights/bulk_load.h) or the old one (each weight uploaded from the memory mapping as its network requires
/// it). Whether the files come from the disk or from the page cache is the caller's business
/// (scripts/bench/load_cold_warm.sh drops the caches).
#include <string>

#include "weights/bulk_load.h"

namespace dzr::app {

struct LoadBenchOptions {
    std::string checkpoint;
    std::string device = "cuda:0";
    std::string path = "new";  ///< "new" (bulk_load) or "old" (one upload per require)
    BulkLoadOptions bulk;
    int repeat = 1;    ///< loads in one process (the second one reads from the page cache)
    std::string json;  ///< also write the numbers here
};

int run_load_bench(const LoadBenchOptions& options);

}  // namespace dzr::app
