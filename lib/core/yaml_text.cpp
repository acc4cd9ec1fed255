#include "core/yaml_text.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cstdint>
#include <map>

#include "core/error.h"

namespace dzr {

namespace {

/// "name" when `line` reads `  name: ...` (or `name:` at its end), else "".
std::string key_of(std::string_view line) {
    size_t i = 0;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const size_t start = i;
    if (i >= line.size() || !(std::isalpha(uint8_t(line[i])) || line[i] == '_')) return {};
    while (i < line.size() &&
           (std::isalnum(uint8_t(line[i])) || line[i] == '_' || line[i] == '-' || line[i] == '.'))
        ++i;
    const size_t end = i;
    while (i < line.size() && line[i] == ' ') ++i;
    if (i >= line.size() || line[i] != ':') return {};
    if (i + 1 < line.size() && line[i + 1] != ' ' && line[i + 1] != '\t' && line[i + 1] != '\r') return {};
    return std::string(line.substr(start, end - start));
}

}  // namespace

std::vector<std::string> yaml_swallowed_keys(std::string_view text, int line, int column) {
    if (line < 0 || column < 0) return {};
    size_t pos = 0;
    for (int l = 0; l < line; ++l) {
        pos = text.find('\n', pos);
        if (pos == std::string_view::npos) return {};
        ++pos;
    }
    pos += size_t(column);
    if (pos >= text.size() || (text[pos] != '"' && text[pos] != '\'')) return {};
    const char quote = text[pos];
    std::vector<std::string> keys;
    size_t line_start = std::string_view::npos;  // start of the current continuation line
    for (size_t i = pos + 1; i < text.size(); ++i) {
        const char c = text[i];
        if (quote == '"' && c == '\\') {
            ++i;  // an escaped character (an escaped line break continues the scalar too)
            continue;
        }
        if (c == quote) {
            if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
                ++i;  // '' is a quote inside a single-quoted scalar
                continue;
            }
            // The closing quote: the last continuation line ends here.
            if (line_start != std::string_view::npos) {
                if (auto k = key_of(text.substr(line_start, i - line_start)); !k.empty()) keys.push_back(k);
            }
            return keys;
        }
        if (c == '\n') {
            if (line_start != std::string_view::npos) {
                if (auto k = key_of(text.substr(line_start, i - line_start)); !k.empty()) keys.push_back(k);
            }
            line_start = i + 1;
        }
    }
    if (line_start != std::string_view::npos && line_start < text.size()) {
        if (auto k = key_of(text.substr(line_start)); !k.empty()) keys.push_back(k);
    }
    return keys;
}

void check_yaml_unique_keys(const YAML::Node& root, const std::string& source) {
    if (root.IsSequence()) {
        for (const auto& item : root) check_yaml_unique_keys(item, source);
        return;
    }
    if (!root.IsMap()) return;
    std::map<std::string, int> seen;  // key -> 1-based line
    for (const auto& kv : root) {
        if (kv.first.IsScalar()) {
            const int line = kv.first.Mark().line + 1;
            const auto [it, inserted] = seen.emplace(kv.first.Scalar(), line);
            DZR_CHECK(inserted, "{}: line {}: key '{}' given twice (first on line {})", source, line, kv.first.Scalar(),
                      it->second);
        }
        check_yaml_unique_keys(kv.second, source);
    }
}

}  // namespace dzr
