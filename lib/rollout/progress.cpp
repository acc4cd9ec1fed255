#include "rollout/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace dzr::rollout {

namespace {

bool looks_numeric(const std::string& s) {
    if (s.empty()) return false;
    char* end = nullptr;
    std::strtod(s.c_str(), &end);
    return end != s.c_str() && *end == '\0';
}

}  // namespace

ProgressLine::ProgressLine(std::FILE* out, Mode mode) : out_(out) {
    const int fd = fileno(out);
    tty_ = mode == Mode::Tty || (mode == Mode::Auto && fd >= 0 && isatty(fd));
    winsize ws{};
    if (tty_ && fd >= 0 && ioctl(fd, TIOCGWINSZ, &ws) == 0) columns_ = ws.ws_col;
}

ProgressLine::~ProgressLine() {
    if (open_) finish();
}

void ProgressLine::update(std::string_view text) {
    if (!tty_) {
        std::fprintf(out_, "%.*s\n", int(text.size()), text.data());
        std::fflush(out_);
        return;
    }
    // NOTE: a line longer than the terminal wraps, and "\r" then returns only to the last row; cut it.
    if (columns_ > 1 && text.size() >= size_t(columns_)) text = text.substr(0, size_t(columns_ - 1));
    std::fprintf(out_, "\r%.*s\x1b[K", int(text.size()), text.data());
    std::fflush(out_);
    open_ = true;
}

void ProgressLine::clear() {
    if (!tty_ || !open_) return;
    std::fprintf(out_, "\r\x1b[K");
    std::fflush(out_);
    open_ = false;
}

void ProgressLine::finish(std::string_view text) {
    if (tty_) {
        if (!text.empty()) {
            std::fprintf(out_, "\r%.*s\x1b[K\n", int(text.size()), text.data());
        } else if (open_) {
            std::fprintf(out_, "\n");
        }
    } else if (!text.empty()) {
        std::fprintf(out_, "%.*s\n", int(text.size()), text.data());
    }
    std::fflush(out_);
    open_ = false;
}

std::string progress_bar(int64_t done, int64_t total, int width) {
    const double f = total > 0 ? std::clamp(double(done) / double(total), 0.0, 1.0) : 0.0;
    const int filled = int(std::floor(f * width));
    std::string bar = "[";
    for (int i = 0; i < width; ++i) bar += i < filled ? '=' : (i == filled && filled < width && done > 0 ? '>' : ' ');
    return bar + fmt::format("] {:3d}%", int(std::floor(f * 100)));
}

std::string format_duration(double s) {
    if (!std::isfinite(s) || s < 0) return "?";
    if (s < 1.0) return fmt::format("{:.0f} ms", s * 1e3);
    if (s < 60.0) return fmt::format("{:.1f} s", s);
    const auto total = int64_t(std::llround(s));
    if (total < 3600) return fmt::format("{}m{:02d}s", total / 60, total % 60);
    return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
}

std::string format_progress(int64_t episode, int64_t episodes, std::string_view name, int64_t call, int64_t calls,
                            double seconds_per_call) {
    std::string s = fmt::format("episode {}/{} {}  call {}/{} {}", episode, episodes, name, call, calls,
                                progress_bar(call, calls));
    if (seconds_per_call > 0 && std::isfinite(seconds_per_call)) {
        s += fmt::format("  {:.2f} s/call", seconds_per_call);
        if (call < calls) s += "  eta " + format_duration(seconds_per_call * double(calls - call));
    }
    return s;
}

std::string format_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
    size_t ncol = header.size();
    for (const auto& r : rows) ncol = std::max(ncol, r.size());
    std::vector<size_t> width(ncol, 0);
    auto cell = [](const std::vector<std::string>& r, size_t c) { return c < r.size() ? r[c] : std::string(); };
    for (size_t c = 0; c < ncol; ++c) {
        width[c] = cell(header, c).size();
        for (const auto& r : rows) width[c] = std::max(width[c], cell(r, c).size());
    }
    auto line = [&](const std::vector<std::string>& r, bool is_header) {
        std::string s;
        for (size_t c = 0; c < ncol; ++c) {
            const std::string v = cell(r, c);
            const bool right = !is_header && looks_numeric(v);
            if (c) s += "  ";
            s += right ? fmt::format("{:>{}}", v, width[c]) : fmt::format("{:<{}}", v, width[c]);
        }
        while (!s.empty() && s.back() == ' ') s.pop_back();
        return s + "\n";
    };
    std::string out = line(header, true);
    size_t rule = 0;
    for (size_t c = 0; c < ncol; ++c) rule += width[c] + (c ? 2 : 0);
    out += std::string(rule, '-') + "\n";
    for (const auto& r : rows) out += line(r, false);
    return out;
}

}  // namespace dzr::rollout
