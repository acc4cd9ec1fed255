#pragma once
/// Console helpers: a progress line on stderr that redraws in place on a terminal and prints plain
/// lines otherwise (logs, CI), and a fixed-width table for the end-of-run summary.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace dzr::rollout {

class ProgressLine {
public:
    enum class Mode { Auto, Tty, Plain };

    /// Auto picks Tty when `out` is a terminal.
    explicit ProgressLine(std::FILE* out = stderr, Mode mode = Mode::Auto);
    ~ProgressLine();
    ProgressLine(const ProgressLine&) = delete;
    ProgressLine& operator=(const ProgressLine&) = delete;

    bool is_tty() const { return tty_; }

    /// Tty: redraws the line ("\r", text cut to the terminal width, clear to end of line).
    /// Plain: prints `text` as its own line.
    void update(std::string_view text);
    /// Ends the progress line (Tty: final text and a newline; Plain: prints `text` if not empty).
    void finish(std::string_view text = {});
    /// Tty: erases the current line so that a log message can be printed cleanly.
    void clear();

private:
    std::FILE* out_;
    bool tty_ = false;
    bool open_ = false;  // a Tty line is on screen without its newline
    int columns_ = 0;    // terminal width (0 = unknown)
};

/// "[=========>          ] 45%" with `width` cells between the brackets.
std::string progress_bar(int64_t done, int64_t total, int width = 20);

/// A duration for people: "850 ms", "12.3 s", "4m05s", "2h03m".
std::string format_duration(double seconds);

/// "episode 2/5 ep_001  call 7/18 [=====>   ] 38%  1.92 s/call  eta 21.1 s".
std::string format_progress(int64_t episode, int64_t episodes, std::string_view name, int64_t call, int64_t calls,
                            double seconds_per_call);

/// A plain-text table: a header row, a rule, then the rows; columns padded to their widest cell,
/// numbers (cells that parse as one) right-aligned.
std::string format_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

}  // namespace dzr::rollout
