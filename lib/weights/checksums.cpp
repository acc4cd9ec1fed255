#include "weights/checksums.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/parallel.h"
#include "core/sha256.h"

namespace dzr {

namespace fs = std::filesystem;

namespace {

std::map<std::string, std::string> hash_files(const fs::path& dir, const std::vector<std::string>& files) {
    std::map<std::string, std::string> out;
    std::mutex mu;
    parallel_for(files.size(), worker_threads(files.size(), 4), [&](size_t i) {
        const std::string h = sha256_file(dir / files[i]);
        std::lock_guard<std::mutex> lock(mu);
        out[files[i]] = h;
    });
    return out;
}

bool is_hex_digest(const std::string& s) {
    if (s.size() != 64) return false;
    for (char c : s)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    return true;
}

}  // namespace

void write_checksums(const fs::path& dir, const std::vector<std::string>& files) {
    std::string text;
    for (const auto& [name, digest] : hash_files(dir, files)) text += digest + "  " + name + "\n";
    const fs::path p = dir / kChecksumsFile;
    std::FILE* f = std::fopen(p.c_str(), "wb");
    DZR_CHECK(f != nullptr, "cannot create {}: {}", p.string(), std::strerror(errno));
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool closed = std::fclose(f) == 0;
    DZR_CHECK(ok && closed, "cannot write {}: {}", p.string(), std::strerror(errno));
}

std::map<std::string, std::string> parse_checksums(const std::string& text, const std::string& source) {
    std::map<std::string, std::string> out;
    size_t pos = 0, line_no = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || line[0] == '#') continue;
        // "<digest>  <name>" (text mode) or "<digest> *<name>" (binary mode)
        DZR_CHECK(line.size() > 66 && line[64] == ' ' && (line[65] == ' ' || line[65] == '*'),
                  "{}: line {}: expected '<sha256 hex digest>  <file>'", source, line_no);
        std::string digest = line.substr(0, 64);
        for (char& c : digest) c = char(std::tolower(static_cast<unsigned char>(c)));
        DZR_CHECK(is_hex_digest(digest), "{}: line {}: '{}' is not a SHA-256 hex digest", source, line_no,
                  line.substr(0, 64));
        const std::string name = line.substr(66);
        DZR_CHECK(!name.empty() && name.find("..") == std::string::npos && name[0] != '/',
                  "{}: line {}: '{}' is not a path inside the checkpoint directory", source, line_no, name);
        DZR_CHECK(out.emplace(name, digest).second, "{}: line {}: {} is listed twice", source, line_no, name);
    }
    return out;
}

ChecksumReport verify_checksums(const fs::path& dir, const std::vector<std::string>& files) {
    ChecksumReport r;
    const fs::path list_path = dir / kChecksumsFile;
    std::error_code ec;
    std::map<std::string, std::string> listed;
    if (fs::is_regular_file(list_path, ec)) {
        r.had_list = true;
        std::FILE* f = std::fopen(list_path.c_str(), "rb");
        DZR_CHECK(f != nullptr, "cannot open {}: {}", list_path.string(), std::strerror(errno));
        std::string text;
        char buf[65536];
        for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
        std::fclose(f);
        listed = parse_checksums(text, list_path.string());
    }
    std::set<std::string> to_hash(files.begin(), files.end());
    for (const auto& [name, digest] : listed) {
        if (fs::is_regular_file(dir / name, ec)) {
            to_hash.insert(name);
        } else {
            r.problems.push_back(
                fmt::format("{}: listed in {} but missing", (dir / name).string(), kChecksumsFile));
        }
    }
    r.computed = hash_files(dir, std::vector<std::string>(to_hash.begin(), to_hash.end()));
    for (const auto& [name, digest] : r.computed) {
        if (!r.had_list) continue;
        auto it = listed.find(name);
        if (it == listed.end()) {
            r.problems.push_back(fmt::format("{}: not listed in {}", (dir / name).string(), kChecksumsFile));
        } else if (it->second != digest) {
            r.problems.push_back(fmt::format("{}: SHA-256 {} but {} says {} (the file changed or is damaged)",
                                             (dir / name).string(), digest, kChecksumsFile, it->second));
        } else {
            ++r.matched;
        }
    }
    return r;
}

}  // namespace dzr
