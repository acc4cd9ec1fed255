#pragma once
/// Checks on the raw text of a YAML document that the parsed tree cannot show. A quoted scalar whose closing
/// quote is missing on its line runs on over the next lines (YAML folds them into the value), so
///     prompt: "pick up the cup
///     fps: 15
/// parses as a prompt "pick up the cup fps: 15 ..." and the keys after it vanish without an error.
#include <string>
#include <string_view>
#include <vector>

namespace YAML {
class Node;
}

namespace dzr {

/// Throws dzr::Error when a mapping anywhere in `root` gives a key twice (yaml-cpp keeps both and a lookup
/// silently takes the first): "SOURCE: line 7: key 'seed' given twice (first on line 3)".
void check_yaml_unique_keys(const YAML::Node& root, const std::string& source);

/// The key-like lines ("name:" at the start of a line) that a quoted scalar runs over before its closing
/// quote. (line, column) is the scalar's 0-based start as yaml-cpp's Mark gives it. Empty when the text there
/// is not a quote, or the scalar closes on its own line, or its continuation lines look like plain text.
std::vector<std::string> yaml_swallowed_keys(std::string_view text, int line, int column);

}  // namespace dzr
