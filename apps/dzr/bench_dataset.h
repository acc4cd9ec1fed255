#pragma once
/// `dzr bench prepare --dataset DIR`: how fast episodes come out of a LeRobot dataset (or episode directories):
/// each selected episode read as a rollout reads it (parquet, the frames decoded at the parquet's timestamps), timed
/// on one thread, reported as frames and calls per second. A rollout reads the next episode on a host thread while
/// the current one's calls run, so decoding stays off the calls' path while it is faster than they are.
#include <string>

#include "io/episode_source.h"

namespace dzr::app {

struct DatasetBenchOptions {
    std::string path;                ///< a LeRobot root or episode directories
    io::DatasetSelection selection;  ///< --episodes / --split
    std::string embodiment = "oxe_droid";
    int repeats = 1;                 ///< reads of each episode (the median is reported)
};

int run_dataset_bench(const DatasetBenchOptions& options);

}  // namespace dzr::app
