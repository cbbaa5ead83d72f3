// `cxlrt top`: the live view of a pool (docs/metrics.md, "cxlrt top"). It
// reads the pool-wide metrics and the host table without attaching, every
// period, and draws tools/top_view.h's frame with ncurses; between reads
// it watches the heartbeats (every 10 ms) and the keyboard. With --once or
// --iterations it prints frames as text instead (no terminal needed).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/metrics/pool_metrics.h"
#include "cxlrt/runtime/pool.h"
#include "tools/commands.h"
#include "tools/top_view.h"

#ifdef CXLRT_HAVE_CURSES
#include <curses.h>
#endif

namespace cxlrt::tools {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// Sleeps until `until`, watching the heartbeats; false when a signal came.
bool WatchUntil(metrics::PoolMetricsReader& reader, absl::Time until) {
  while (!g_stop.load() && absl::Now() < until) {
    reader.Observe();
    absl::SleepFor(std::min(absl::Milliseconds(10), until - absl::Now()));
  }
  return !g_stop.load();
}

int TextFrames(const std::string& uri, runtime::Pool& pool, const TopOptions& o) {
  metrics::PoolMetricsReader reader(pool);
  TopModel model;
  const absl::Duration period = absl::Seconds(o.period_s);
  absl::Time next = absl::Now();
  for (int i = 0; i < o.iterations; ++i) {
    if (i > 0 && !WatchUntil(reader, next)) break;
    next = absl::Now() + period;
    TopFrame f =
        model.Update(reader.Read(i == 0 ? metrics::FirstReadWindow(pool) : absl::ZeroDuration()));
    if (i > 0) std::printf("\n");
    for (const TopLine& l : RenderTop(f, {uri, absl::Now(), period, false})) {
      std::printf("%s\n", l.text.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

#ifdef CXLRT_HAVE_CURSES

// The live view: the title lines stay, the rest scrolls.
class Screen {
 public:
  // Takes the terminal; kFailedPrecondition when ncurses cannot drive it
  // (initscr would print and exit instead).
  static absl::StatusOr<std::unique_ptr<Screen>> Open() {
    const char* term = getenv("TERM");
    SCREEN* s = newterm(nullptr, stdout, stdin);
    if (s == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("ncurses cannot drive the terminal (TERM=", term != nullptr ? term : "unset",
                       "); --once and --iterations N print frames as text"));
    }
    return std::unique_ptr<Screen>(new Screen(s));
  }
  ~Screen() {
    endwin();
    delscreen(screen_);
  }
  Screen(const Screen&) = delete;
  Screen& operator=(const Screen&) = delete;

  void Draw(const std::vector<TopLine>& lines, int* scroll) {
    erase();
    const int fixed = std::min<int>(2, static_cast<int>(lines.size()));
    const int rows = LINES, body = std::max(0, rows - fixed);
    const int total = static_cast<int>(lines.size()) - fixed;
    *scroll = std::clamp(*scroll, 0, std::max(0, total - body));
    int y = 0;
    for (int i = 0; i < fixed && y < rows; ++i) Put(y++, lines[i]);
    for (int i = fixed + *scroll; i < static_cast<int>(lines.size()) && y < rows; ++i) {
      if (y == rows - 1 && i < static_cast<int>(lines.size()) - 1) {
        const int more = static_cast<int>(lines.size()) - i;
        Put(y++,
            {absl::StrCat("-- ", more, " more lines: down or j to scroll --"), TopStyle::kColumns});
        break;
      }
      Put(y++, lines[i]);
    }
    refresh();
  }

 private:
  explicit Screen(SCREEN* s) : screen_(s) {
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    timeout(10);  // getch waits 10 ms at most: heartbeats are watched between keys
    if (has_colors()) {
      start_color();
      use_default_colors();
      init_pair(1, COLOR_RED, -1);
      init_pair(2, COLOR_CYAN, -1);
      colors_ = true;
    }
  }

  void Put(int y, const TopLine& l) {
    attr_t a = A_NORMAL;
    switch (l.style) {
      case TopStyle::kTitle:
        a = A_BOLD;
        break;
      case TopStyle::kHeading:
        a = A_BOLD | (colors_ ? COLOR_PAIR(2) : 0);
        break;
      case TopStyle::kColumns:
        a = A_REVERSE;
        break;
      case TopStyle::kWarning:
        a = colors_ ? COLOR_PAIR(1) : A_BOLD;
        break;
      case TopStyle::kPlain:
        break;
    }
    attron(a);
    mvaddnstr(y, 0, l.text.c_str(), COLS);
    if (l.style == TopStyle::kColumns) {
      // The bar spans the width, as top's does.
      for (int x = std::min<int>(COLS, static_cast<int>(l.text.size())); x < COLS; ++x) {
        mvaddch(y, x, ' ');
      }
    }
    attroff(a);
  }
  SCREEN* const screen_;
  bool colors_ = false;
};

int Live(const std::string& uri, runtime::Pool& pool, const TopOptions& o) {
  metrics::PoolMetricsReader reader(pool);
  TopModel model;
  const absl::Duration period = absl::Seconds(o.period_s);
  // Read once before the screen takes the terminal: a slow first look
  // shows nothing half drawn.
  TopFrame frame = model.Update(reader.Read(metrics::FirstReadWindow(pool)));
  absl::Time next = absl::Now() + period;
  auto screen = Screen::Open();
  if (!screen.ok()) {
    std::fprintf(stderr, "cxlrt top: %s\n", std::string(screen.status().message()).c_str());
    return 1;
  }
  int scroll = 0;
  std::vector<TopLine> lines = RenderTop(frame, {uri, absl::Now(), period, true});
  (*screen)->Draw(lines, &scroll);
  while (!g_stop.load()) {
    const int ch = getch();  // waits 10 ms at most
    bool redraw = false;
    switch (ch) {
      case 'q':
      case 'Q':
        return 0;
      case 'r':
      case 'R':
        next = absl::Now();
        break;
      case KEY_DOWN:
      case 'j':
        ++scroll;
        redraw = true;
        break;
      case KEY_UP:
      case 'k':
        --scroll;
        redraw = true;
        break;
      case KEY_NPAGE:
      case ' ':
        scroll += std::max(1, LINES - 3);
        redraw = true;
        break;
      case KEY_PPAGE:
        scroll -= std::max(1, LINES - 3);
        redraw = true;
        break;
      case KEY_HOME:
        scroll = 0;
        redraw = true;
        break;
      case KEY_RESIZE:
        redraw = true;
        break;
      default:
        break;
    }
    reader.Observe();
    if (absl::Now() >= next) {
      next = absl::Now() + period;
      frame = model.Update(reader.Read());
      lines = RenderTop(frame, {uri, absl::Now(), period, true});
      redraw = true;
    }
    if (redraw) (*screen)->Draw(lines, &scroll);
  }
  return 0;
}

#endif  // CXLRT_HAVE_CURSES

}  // namespace

int Top(const std::string& uri, const TopOptions& o) {
  if (!(o.period_s >= 0.05 && o.period_s <= 3600)) {
    std::fprintf(stderr, "cxlrt top: --period %g is not in [0.05, 3600] seconds\n", o.period_s);
    return 2;
  }
  if (o.iterations < 0) {
    std::fprintf(stderr, "cxlrt top: --iterations %d is negative\n", o.iterations);
    return 2;
  }
  const bool live = o.iterations == 0;
#ifndef CXLRT_HAVE_CURSES
  if (live) {
    std::fprintf(stderr,
                 "cxlrt top: this cxlrt was built without ncurses (apt-get install "
                 "libncurses-dev, then configure again): it has no live view; --once and "
                 "--iterations N print frames as text\n");
    return 1;
  }
#endif
  if (live && (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO))) {
    std::fprintf(stderr,
                 "cxlrt top: the live view needs a terminal on standard input and output; "
                 "--once and --iterations N print frames as text\n");
    return 2;
  }
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) {
    std::fprintf(stderr, "cxlrt top: %s\n", std::string(pool.status().message()).c_str());
    return 1;
  }
  g_stop.store(false);
  // Installed before ncurses starts, which then leaves them in place.
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
#ifdef CXLRT_HAVE_CURSES
  if (live) return Live(uri, **pool, o);
#endif
  return TextFrames(uri, **pool, o);
}

}  // namespace cxlrt::tools
