// Prompt template and text cleaning. Text is processed as code points (UTF-32) so that character
// classes and the 32-character entity-name limit of html.unescape count characters as Python does.
#include "policy/prompt.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace dzr {
namespace {

using U32 = std::u32string;

constexpr char32_t kReplacement = 0xFFFD;

U32 decode_utf8(std::string_view s) {
    U32 out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const auto b0 = uint8_t(s[i]);
        int len = 0;
        char32_t cp = 0;
        if (b0 < 0x80) {
            len = 1;
            cp = b0;
        } else if ((b0 & 0xE0) == 0xC0) {
            len = 2;
            cp = b0 & 0x1F;
        } else if ((b0 & 0xF0) == 0xE0) {
            len = 3;
            cp = b0 & 0x0F;
        } else if ((b0 & 0xF8) == 0xF0) {
            len = 4;
            cp = b0 & 0x07;
        }
        bool ok = len > 0 && i + size_t(len) <= s.size();
        for (int k = 1; ok && k < len; ++k) {
            const auto b = uint8_t(s[i + size_t(k)]);
            ok = (b & 0xC0) == 0x80;
            cp = (cp << 6) | (b & 0x3F);
        }
        // reject overlong forms, surrogates and values past U+10FFFF
        if (ok) {
            const char32_t min_for_len[5] = {0, 0, 0x80, 0x800, 0x10000};
            ok = cp >= min_for_len[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (!ok) {
            out.push_back(kReplacement);
            ++i;
            continue;
        }
        out.push_back(cp);
        i += size_t(len);
    }
    return out;
}

void append_utf8(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

std::string encode_utf8(const U32& s) {
    std::string out;
    out.reserve(s.size());
    for (char32_t c : s) append_utf8(out, c);
    return out;
}

// Python str.isspace().
bool is_space(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

U32 strip(const U32& s) {
    size_t b = 0, e = s.size();
    while (b < e && is_space(s[b])) ++b;
    while (e > b && is_space(s[e - 1])) --e;
    return s.substr(b, e - b);
}

// str.lower() for the covered blocks. U+0130 lowers to "i" + U+0307 as in Python.
void append_lower(U32& out, char32_t c) {
    if (c >= 'A' && c <= 'Z') {
        out.push_back(c + 32);
    } else if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) {
        out.push_back(c + 32);
    } else if (c == 0x130) {
        out.push_back('i');
        out.push_back(0x307);
    } else if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) {
        out.push_back(c % 2 == 0 ? c + 1 : c);
    } else if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) {
        out.push_back(c % 2 == 1 ? c + 1 : c);
    } else if (c == 0x178) {
        out.push_back(0xFF);
    } else if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) {
        out.push_back(c + 32);
    } else if (c == 0x386) {
        out.push_back(0x3AC);
    } else if (c >= 0x388 && c <= 0x38A) {
        out.push_back(c + 37);
    } else if (c == 0x38C) {
        out.push_back(0x3CC);
    } else if (c == 0x38E || c == 0x38F) {
        out.push_back(c + 63);
    } else if (c >= 0x410 && c <= 0x42F) {
        out.push_back(c + 32);
    } else if (c >= 0x400 && c <= 0x40F) {
        out.push_back(c + 80);
    } else if (c >= 0xFF21 && c <= 0xFF3A) {
        out.push_back(c + 32);
    } else {
        out.push_back(c);
    }
}

U32 lower(const U32& s) {
    U32 out;
    out.reserve(s.size());
    for (char32_t c : s) append_lower(out, c);
    return out;
}

// ---- html.unescape ------------------------------------------------------------------------------

struct NamedEntity {
    std::u32string_view name;
    char32_t value;
    bool legacy;  // also recognised without ';' (HTML5 legacy entities)
};

// Names of U+00A0..U+00FF: all of them are HTML5 legacy entities.
constexpr std::u32string_view kLatin1Names[96] = {
    U"nbsp",   U"iexcl",  U"cent",   U"pound",  U"curren", U"yen",    U"brvbar", U"sect",   U"uml",
    U"copy",   U"ordf",   U"laquo",  U"not",    U"shy",    U"reg",    U"macr",   U"deg",    U"plusmn",
    U"sup2",   U"sup3",   U"acute",  U"micro",  U"para",   U"middot", U"cedil",  U"sup1",   U"ordm",
    U"raquo",  U"frac14", U"frac12", U"frac34", U"iquest", U"Agrave", U"Aacute", U"Acirc",  U"Atilde",
    U"Auml",   U"Aring",  U"AElig",  U"Ccedil", U"Egrave", U"Eacute", U"Ecirc",  U"Euml",   U"Igrave",
    U"Iacute", U"Icirc",  U"Iuml",   U"ETH",    U"Ntilde", U"Ograve", U"Oacute", U"Ocirc",  U"Otilde",
    U"Ouml",   U"times",  U"Oslash", U"Ugrave", U"Uacute", U"Ucirc",  U"Uuml",   U"Yacute", U"THORN",
    U"szlig",  U"agrave", U"aacute", U"acirc",  U"atilde", U"auml",   U"aring",  U"aelig",  U"ccedil",
    U"egrave", U"eacute", U"ecirc",  U"euml",   U"igrave", U"iacute", U"icirc",  U"iuml",   U"eth",
    U"ntilde", U"ograve", U"oacute", U"ocirc",  U"otilde", U"ouml",   U"divide", U"oslash", U"ugrave",
    U"uacute", U"ucirc",  U"uuml",   U"yacute", U"thorn",  U"yuml"};

// The other legacy names, then common entities that need ';' (Python's table has 2231 in all; every
// legacy name is here, so the longest-prefix rule behaves exactly).
constexpr NamedEntity kEntities[] = {
    {U"amp", '&', true},        {U"lt", '<', true},         {U"gt", '>', true},
    {U"quot", '"', true},       {U"AMP", '&', true},        {U"LT", '<', true},
    {U"GT", '>', true},         {U"QUOT", '"', true},       {U"COPY", 0xA9, true},
    {U"REG", 0xAE, true},       {U"apos", '\'', false},     {U"hellip", 0x2026, false},
    {U"mdash", 0x2014, false},  {U"ndash", 0x2013, false},  {U"lsquo", 0x2018, false},
    {U"rsquo", 0x2019, false},  {U"ldquo", 0x201C, false},  {U"rdquo", 0x201D, false},
    {U"sbquo", 0x201A, false},  {U"bdquo", 0x201E, false},  {U"trade", 0x2122, false},
    {U"euro", 0x20AC, false},   {U"bull", 0x2022, false},   {U"larr", 0x2190, false},
    {U"rarr", 0x2192, false},   {U"uarr", 0x2191, false},   {U"darr", 0x2193, false},
    {U"minus", 0x2212, false},  {U"prime", 0x2032, false},  {U"Prime", 0x2033, false},
    {U"lsaquo", 0x2039, false}, {U"rsaquo", 0x203A, false}, {U"ensp", 0x2002, false},
    {U"emsp", 0x2003, false},   {U"thinsp", 0x2009, false}, {U"zwnj", 0x200C, false},
    {U"zwj", 0x200D, false},    {U"dagger", 0x2020, false}, {U"Dagger", 0x2021, false},
    {U"permil", 0x2030, false}, {U"OElig", 0x152, false},   {U"oelig", 0x153, false},
    {U"Scaron", 0x160, false},  {U"scaron", 0x161, false},  {U"Yuml", 0x178, false},
    {U"fnof", 0x192, false},    {U"circ", 0x2C6, false},    {U"tilde", 0x2DC, false},
    {U"infin", 0x221E, false},  {U"ne", 0x2260, false},     {U"le", 0x2264, false},
    {U"ge", 0x2265, false},     {U"asymp", 0x2248, false},
};

std::optional<char32_t> entity_value(const U32& name, bool with_semicolon) {
    for (int i = 0; i < 96; ++i)
        if (kLatin1Names[i] == name) return char32_t(0xA0 + i);
    for (const NamedEntity& e : kEntities)
        if (e.name == name && (with_semicolon || e.legacy)) return e.value;
    return std::nullopt;
}

// Windows-1252 meanings of 0x80..0x9F (html's _invalid_charrefs and ftfy's fix_c1_controls);
// 0 = no mapping (the code point is kept).
constexpr char32_t kCp1252[32] = {0x20AC, 0,      0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
                                  0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0,      0x017D, 0,
                                  0,      0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
                                  0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0,      0x017E, 0x0178};

bool invalid_codepoint(uint64_t n) {
    return (n >= 0x1 && n <= 0x8) || n == 0xB || (n >= 0xE && n <= 0x1F) || (n >= 0x7F && n <= 0x9F) ||
           (n >= 0xFDD0 && n <= 0xFDEF) || (n & 0xFFFE) == 0xFFFE;
}

// One numeric reference (Python html._replace_charref, '#' branch).
void append_numeric(U32& out, uint64_t n) {
    if (n == 0) {
        out.push_back(kReplacement);
    } else if (n == 0x0D) {
        out.push_back('\r');
    } else if (n >= 0x80 && n <= 0x9F) {
        out.push_back(kCp1252[n - 0x80] ? kCp1252[n - 0x80] : char32_t(n));
    } else if ((n >= 0xD800 && n <= 0xDFFF) || n > 0x10FFFF) {
        out.push_back(kReplacement);
    } else if (invalid_codepoint(n)) {
        // dropped
    } else {
        out.push_back(char32_t(n));
    }
}

bool is_digit(char32_t c) {
    return c >= '0' && c <= '9';
}
bool is_hex(char32_t c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool name_char(char32_t c) {
    return !(c == '\t' || c == '\n' || c == '\f' || c == ' ' || c == '<' || c == '&' || c == '#' || c == ';');
}
bool ascii_alnum(char32_t c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// require_semicolon: only `&name;` / `&#n;` forms (ftfy's unescape_html); else Python html.unescape.
U32 unescape(const U32& s, bool require_semicolon) {
    U32 out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        if (s[i] != '&') {
            out.push_back(s[i++]);
            continue;
        }
        size_t j = i + 1;
        if (j < s.size() && s[j] == '#') {
            const bool hex = j + 1 < s.size() && (s[j + 1] == 'x' || s[j + 1] == 'X');
            size_t k = j + (hex ? 2 : 1);
            const size_t start = k;
            uint64_t n = 0;
            while (k < s.size() && (hex ? is_hex(s[k]) : is_digit(s[k]))) {
                const char32_t c = s[k];
                const uint64_t d = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
                n = std::min<uint64_t>(n * (hex ? 16 : 10) + d, uint64_t(1)
                                                                    << 40);  // saturate: > 0x10FFFF anyway
                ++k;
            }
            const bool semi = k < s.size() && s[k] == ';';
            if (k == start || (require_semicolon && !semi)) {
                out.push_back(s[i++]);
                continue;
            }
            append_numeric(out, n);
            i = k + (semi ? 1 : 0);
            continue;
        }
        // named: [^\t\n\f <&#;]{1,32};?
        size_t k = j;
        while (k < s.size() && k - j < 32 && name_char(s[k]) && (!require_semicolon || ascii_alnum(s[k])))
            ++k;
        if (k == j) {
            out.push_back(s[i++]);
            continue;
        }
        const bool semi = k < s.size() && s[k] == ';';
        const U32 name = s.substr(j, k - j);
        if (semi) {
            if (const auto v = entity_value(name, true)) {
                out.push_back(*v);
                i = k + 1;
                continue;
            }
        }
        if (require_semicolon) {
            out.push_back(s[i++]);
            continue;
        }
        if (!semi) {
            if (const auto v = entity_value(name, false)) {  // a legacy name without ';'
                out.push_back(*v);
                i = k;
                continue;
            }
        }
        // longest legacy prefix of at least 2 characters; the rest of the name is kept
        bool done = false;
        const size_t full = name.size() + (semi ? 1 : 0);
        for (size_t x = full - 1; x >= 2 && !done; --x) {
            if (const auto v = entity_value(name.substr(0, x), false)) {
                out.push_back(*v);
                out.append(name.substr(x));
                if (semi) out.push_back(';');
                done = true;
            }
        }
        if (!done) {
            out.push_back('&');
            out.append(name);
            if (semi) out.push_back(';');
        }
        i = k + (semi ? 1 : 0);
    }
    return out;
}

// ---- ftfy subset --------------------------------------------------------------------------------

char32_t width_fix(char32_t c) {
    if (c >= 0xFF01 && c <= 0xFF5E) return c - 0xFF01 + 0x21;
    switch (c) {
        case 0x3000:
            return 0x20;
        case 0xFF5F:
            return 0x2985;
        case 0xFF60:
            return 0x2986;
        case 0xFFE0:
            return 0xA2;
        case 0xFFE1:
            return 0xA3;
        case 0xFFE2:
            return 0xAC;
        case 0xFFE3:
            return 0xAF;
        case 0xFFE4:
            return 0xA6;
        case 0xFFE5:
            return 0xA5;
        case 0xFFE6:
            return 0x20A9;
        case 0xFFE8:
            return 0x2502;
        case 0xFFE9:
            return 0x2190;
        case 0xFFEA:
            return 0x2191;
        case 0xFFEB:
            return 0x2192;
        case 0xFFEC:
            return 0x2193;
        case 0xFFED:
            return 0x25A0;
        case 0xFFEE:
            return 0x25CB;
        default:
            return c;
    }
}

std::u32string_view ligature(char32_t c) {
    switch (c) {
        case 0x132:
            return U"IJ";
        case 0x133:
            return U"ij";
        case 0xFB00:
            return U"ff";
        case 0xFB01:
            return U"fi";
        case 0xFB02:
            return U"fl";
        case 0xFB03:
            return U"ffi";
        case 0xFB04:
            return U"ffl";
        case 0xFB05:
            return U"\u017Ft";
        case 0xFB06:
            return U"st";
        default:
            return {};
    }
}

bool ftfy_control(char32_t c) {
    return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
           c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

U32 ftfy_pass(const U32& in, bool unescape_entities) {
    U32 s = unescape_entities ? unescape(in, true) : in;
    U32 out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        char32_t c = s[i];
        // terminal escapes: ESC [ (digits or ;)* letter
        if (c == 0x1B && i + 1 < s.size() && s[i + 1] == '[') {
            size_t k = i + 2;
            while (k < s.size() && (is_digit(s[k]) || s[k] == ';')) ++k;
            if (k < s.size() && ((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z'))) {
                i = k;
                continue;
            }
        }
        if (c >= 0x80 && c <= 0x9F && kCp1252[c - 0x80]) c = kCp1252[c - 0x80];  // fix_c1_controls
        if (const auto lig = ligature(c); !lig.empty()) {
            out.append(lig);
            continue;
        }
        c = width_fix(c);
        if (c == 0x2BC || (c >= 0x2018 && c <= 0x201B)) c = '\'';  // uncurl_quotes
        if (c >= 0x201C && c <= 0x201F) c = '"';
        if (c == '\r') {  // fix_line_breaks
            if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
            c = '\n';
        }
        if (c == 0x2028 || c == 0x2029 || c == 0x85) c = '\n';
        if (ftfy_control(c)) continue;  // remove_control_chars (BOM included)
        out.push_back(c);
    }
    return out;
}

U32 ftfy(const U32& in) {
    const bool entities = in.find(U'<') == U32::npos;
    U32 cur = in;
    for (int round = 0; round < 8; ++round) {
        U32 next = ftfy_pass(cur, entities);
        if (next == cur) break;
        cur = std::move(next);
    }
    return cur;
}

// ---- ast.literal_eval subset --------------------------------------------------------------------

// Parses a quoted string literal at s[i] ('...' or "...", simple escapes); returns false otherwise.
bool parse_quoted(const U32& s, size_t& i, U32& value) {
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return false;
    const char32_t q = s[i];
    size_t k = i + 1;
    U32 v;
    while (k < s.size() && s[k] != q) {
        if (s[k] == '\n') return false;
        if (s[k] == '\\') {
            if (k + 1 >= s.size()) return false;
            const char32_t e = s[k + 1];
            switch (e) {
                case '\\':
                    v.push_back('\\');
                    break;
                case '\'':
                    v.push_back('\'');
                    break;
                case '"':
                    v.push_back('"');
                    break;
                case 'n':
                    v.push_back('\n');
                    break;
                case 't':
                    v.push_back('\t');
                    break;
                default:
                    return false;  // other escapes: leave the prompt as it is
            }
            k += 2;
            continue;
        }
        v.push_back(s[k++]);
    }
    if (k >= s.size()) return false;
    i = k + 1;
    value = std::move(v);
    return true;
}

bool parse_int(const U32& s, size_t& i, U32& value) {
    size_t k = i;
    U32 v;
    if (k < s.size() && (s[k] == '-' || s[k] == '+')) {
        if (s[k] == '-') v.push_back('-');
        ++k;
    }
    const size_t digits = k;
    while (k < s.size() && is_digit(s[k])) v.push_back(s[k++]);
    if (k == digits || (s[digits] == '0' && k - digits > 1)) return false;  // Python 3 rejects leading zeros
    i = k;
    value = std::move(v);
    return true;
}

void skip_space(const U32& s, size_t& i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f')) ++i;
}

}  // namespace

std::string unwrap_python_literal(std::string_view text) {
    const U32 s = decode_utf8(text);
    size_t i = 0;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;  // literal_eval strips leading spaces/tabs
    U32 value;
    if (i < s.size() && (s[i] == '[' || s[i] == '(')) {
        const char32_t close = s[i] == '[' ? ']' : ')';
        ++i;
        skip_space(s, i);
        if (!parse_quoted(s, i, value) && !parse_int(s, i, value)) return std::string(text);
        // the remaining elements must be simple literals too, else literal_eval would fail
        skip_space(s, i);
        while (i < s.size() && s[i] == ',') {
            ++i;
            skip_space(s, i);
            if (i < s.size() && s[i] == close) break;
            U32 ignored;
            if (!parse_quoted(s, i, ignored) && !parse_int(s, i, ignored)) return std::string(text);
            skip_space(s, i);
        }
        if (i >= s.size() || s[i] != close) return std::string(text);
        ++i;
    } else if (!parse_quoted(s, i, value)) {
        return std::string(text);
    }
    skip_space(s, i);
    if (i != s.size()) return std::string(text);
    return encode_utf8(value);
}

std::string lower_utf8(std::string_view text) {
    return encode_utf8(lower(decode_utf8(text)));
}

std::string html_unescape(std::string_view text) {
    return encode_utf8(unescape(decode_utf8(text), false));
}

std::string ftfy_subset(std::string_view text) {
    return encode_utf8(ftfy(decode_utf8(text)));
}

std::string droid_prompt(std::string_view instruction) {
    const std::string p = lower_utf8(unwrap_python_literal(instruction));
    std::string out;
    out.reserve(2 * p.size() + 400);
    out += "A multi-view video shows that a robot ";
    out += p;
    out +=
        " The video is split into three views: The top view shows the camera view from the robot's wrist, "
        "the "
        "bottom-left view shows the camera view from the left exterior camera, and the bottom-right view "
        "shows the "
        "camera view from the right exterior camera. During training, one of the two bottom exterior views "
        "may be "
        "a black screen (dropped view). The robot ";
    out += p;
    return out;
}

std::string templated_prompt(PromptTemplate templ, std::string_view instruction) {
    if (templ == PromptTemplate::Droid) return droid_prompt(instruction);
    const std::string p = lower_utf8(unwrap_python_literal(instruction));
    switch (templ) {
        case PromptTemplate::FourViewsHands:
            return "A multi-view video shows that a robot " + p +
                   " The video is split into four views: The top-left view shows the camera view from the robot's "
                   "head, the top-right view shows the camera view from the right hand, the bottom-left view shows "
                   "the camera view from the left hand, and the bottom-right view is a black screen (inactive view). "
                   "The robot " + p;
        case PromptTemplate::FourViewsYam:
            return "A multi-view video shows that a robot " + p +
                   " The video is split into four views: The top-left view shows the top camera, the top-right view "
                   "shows the right camera, the bottom-left view shows the left camera, and the bottom-right view is "
                   "a black screen. The robot " + p;
        case PromptTemplate::SingleViewHuman:
            return "A single view video shows that a human " + p;
        case PromptTemplate::Droid:
            break;
    }
    return droid_prompt(instruction);
}

std::string clean_prompt_text(std::string_view text) {
    // basic_clean: ftfy.fix_text, html.unescape(html.unescape(.)), strip
    U32 s = strip(unescape(unescape(ftfy(decode_utf8(text)), false), false));
    // whitespace_clean: re.sub(r'\s+', ' ', .), strip
    U32 out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        if (is_space(s[i])) {
            while (i < s.size() && is_space(s[i])) ++i;
            out.push_back(' ');
        } else {
            out.push_back(s[i++]);
        }
    }
    return encode_utf8(strip(out));
}

}  // namespace dzr
