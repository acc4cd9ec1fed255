#pragma once
/// JSON as dzr reads it: nlohmann's parser, plus the one check its tree cannot show. A key given twice in one
/// object is kept once, silently (the last wins), so a hand-edited config.json or metadata.json could lose a
/// setting without a word; dzr refuses it, naming the key and both lines.
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dzr {

/// The first key of valid JSON `text` given twice in one object: the key and the 1-based lines of both.
struct DuplicateKey {
    std::string key;
    int first_line = 0, second_line = 0;
};
std::optional<DuplicateKey> find_duplicate_json_key(std::string_view text);

/// `j` as text for a file we write: invalid UTF-8 in a string (an error message quoting a damaged file's bytes, a
/// path) becomes U+FFFD instead of nlohmann's exception, which would lose the whole file.
template <typename JsonT>
std::string dump_json(const JsonT& j, int indent = 2) {
    return j.dump(indent, ' ', false, JsonT::error_handler_t::replace);
}

/// Parses `text`; throws nlohmann's parse_error for bad syntax (callers add the file) and dzr::Error naming
/// `source`, the key and both lines for a repeated key.
template <typename JsonT = nlohmann::json>
JsonT parse_json_strict(std::string_view text, const std::string& source);

}  // namespace dzr
