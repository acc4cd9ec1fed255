#pragma once
/// An embodiment (config/embodiment.h) as the rollout's inputs and outputs see it: the episode layout the
/// reader checks (io::EpisodeLayout), the names of the action columns, the action keys the metrics
/// group by.
#include <string>
#include <vector>

#include "config/embodiment.h"
#include "io/episode.h"
#include "rollout/reports.h"

namespace dzr::rollout {

/// The files an episode of `e` holds: its cameras, one array per state key, actions of its width; the
/// recorded frame size and rate; DROID zero-fills missing state.
io::EpisodeLayout episode_layout(const Embodiment& e);

/// actions.csv column names: DROID's joint_0 .. joint_6, gripper; otherwise <key> for a 1-wide key and
/// <key>_<i> for the others.
std::vector<std::string> action_column_names(const Embodiment& e);

/// The action keys with their dims [begin, end) (names point into `e`, which must outlive them).
std::vector<ActionKey> action_keys(const Embodiment& e);

}  // namespace dzr::rollout
