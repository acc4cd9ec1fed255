#pragma once
/// The styles and scripts inlined into every report page (rollout/report_html.h): kept in one file,
/// readable, and small (no library).
#include <string_view>

namespace dzr::rollout {

/// Runs first (in <head>): records script errors and resources that fail to load in window.dzrErrors.
extern const std::string_view kReportErrorHook;
/// The page style.
extern const std::string_view kReportCss;
/// The summary table (sort, filter, pages), the synchronised videos and window.dzrSelfTest(), the
/// check the browser test runs (plots drawn, videos playable, no errors).
extern const std::string_view kReportJs;

}  // namespace dzr::rollout
