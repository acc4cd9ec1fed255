#include "core/json_text.h"

#include <map>
#include <vector>

#include "core/error.h"

namespace dzr {

namespace {

/// A key as the object holds it: escapes decoded (so "a\u0062" and "ab" are the same key).
std::string decoded_key(std::string_view raw) {
    if (raw.find('\\') == std::string_view::npos) return std::string(raw);
    std::string quoted;
    quoted.reserve(raw.size() + 2);
    quoted.append(1, '"').append(raw).append(1, '"');
    return nlohmann::json::parse(quoted).get<std::string>();
}

}  // namespace

std::optional<DuplicateKey> find_duplicate_json_key(std::string_view text) {
    // NOTE: the text already parsed, so this scan only tracks strings, nesting and lines
    struct Frame {
        bool object = false;
        bool expect_key = false;
        std::map<std::string, int> keys;  // key -> line
    };
    std::vector<Frame> stack;
    int line = 1;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (c == '\n') {
            ++line;
        } else if (c == '"') {
            const size_t start = ++i;
            while (i < text.size() && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
            if (stack.empty() || !stack.back().object || !stack.back().expect_key) continue;
            Frame& f = stack.back();
            f.expect_key = false;
            const std::string key = decoded_key(text.substr(start, i - start));
            const auto [it, inserted] = f.keys.emplace(key, line);
            if (!inserted) return DuplicateKey{key, it->second, line};
        } else if (c == '{' || c == '[') {
            stack.push_back({c == '{', c == '{', {}});
        } else if (c == '}' || c == ']') {
            if (!stack.empty()) stack.pop_back();
        } else if (c == ',' && !stack.empty() && stack.back().object) {
            stack.back().expect_key = true;
        }
    }
    return std::nullopt;
}

template <typename JsonT>
JsonT parse_json_strict(std::string_view text, const std::string& source) {
    JsonT j = JsonT::parse(text);
    if (const auto d = find_duplicate_json_key(text))
        DZR_THROW("{}: line {}: key \"{}\" given twice in one object (first on line {})", source, d->second_line,
                  d->key, d->first_line);
    return j;
}

template nlohmann::json parse_json_strict<nlohmann::json>(std::string_view, const std::string&);
template nlohmann::ordered_json parse_json_strict<nlohmann::ordered_json>(std::string_view, const std::string&);

}  // namespace dzr
