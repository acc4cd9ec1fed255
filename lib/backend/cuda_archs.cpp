#include "backend/cuda_archs.h"

#include <cctype>
#include <string>

namespace dzr {

namespace {

bool entry_covers(std::string_view e, int cc) {
    if (e == "all" || e == "all-major" || e == "native") return true;
    bool sass = true, ptx = true;
    if (e.size() > 5 && e.substr(e.size() - 5) == "-real") {
        ptx = false;
        e.remove_suffix(5);
    } else if (e.size() > 8 && e.substr(e.size() - 8) == "-virtual") {
        sass = false;
        e.remove_suffix(8);
    }
    const char suffix = !e.empty() && (e.back() == 'a' || e.back() == 'f') ? e.back() : '\0';
    if (suffix != '\0') e.remove_suffix(1);
    if (e.empty() || e.size() > 4) return false;
    int v = 0;
    for (char c : e) {
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
        v = v * 10 + (c - '0');
    }
    if (suffix == 'a') return v == cc;                     // arch-specific: that capability only
    if (suffix == 'f') return v / 10 == cc / 10 && v <= cc;  // family-specific: its major, from its minor on
    return (sass && v / 10 == cc / 10 && v <= cc) || (ptx && v <= cc);
}

}  // namespace

bool cuda_archs_cover(std::string_view archs, int cc) {
    size_t start = 0;
    while (start <= archs.size()) {
        size_t end = archs.find_first_of(";,", start);
        if (end == std::string_view::npos) end = archs.size();
        std::string_view e = archs.substr(start, end - start);
        while (!e.empty() && std::isspace(static_cast<unsigned char>(e.front()))) e.remove_prefix(1);
        while (!e.empty() && std::isspace(static_cast<unsigned char>(e.back()))) e.remove_suffix(1);
        if (!e.empty() && entry_covers(e, cc)) return true;
        start = end + 1;
    }
    return false;
}

}  // namespace dzr
