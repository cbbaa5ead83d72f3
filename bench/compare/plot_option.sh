# Sourced by the compare scripts: their --plot FILE.png option.
#   plot_option_parse "$@"; set -- "${PLOT_ARGS[@]+"${PLOT_ARGS[@]}"}"
#     takes --plot FILE (or --plot=FILE) out of the arguments into PLOT (made
#     absolute, since the scripts cd to the repository), and fails at once,
#     before any sweep, when Debian's python3 has no matplotlib;
#   plot_option_draw TITLE RESULTS.jsonl
#     draws PLOT from the run's JSON lines with python/cxlrt/plot.py and keeps
#     them beside it (FILE.json), when --plot was given.
PLOT=
PLOT_ARGS=()
PLOT_PYTHON=${CXLRT_PYTHON:-/usr/bin/python3}

plot_option_parse() {
  while [ $# -gt 0 ]; do
    case $1 in
      --plot)
        [ $# -ge 2 ] || { echo "$0: --plot needs a file name (FILE.png)" >&2; exit 2; }
        PLOT=$2
        shift 2 ;;
      --plot=*) PLOT=${1#--plot=}; shift ;;
      *) PLOT_ARGS+=("$1"); shift ;;
    esac
  done
  [ -n "$PLOT" ] || return 0
  case $PLOT in /*) ;; *) PLOT=$PWD/$PLOT ;; esac
  [ -d "$(dirname "$PLOT")" ] || { echo "$0: --plot $PLOT: no such directory" >&2; exit 2; }
  "$PLOT_PYTHON" -c "import matplotlib" 2>/dev/null || {
    echo "$0: --plot needs matplotlib in $PLOT_PYTHON: install python3-matplotlib" \
      "(scripts/install-deps.sh does) or set CXLRT_PYTHON" >&2
    exit 2
  }
}

plot_option_draw() {
  [ -n "$PLOT" ] || return 0
  local title=$1 results=$2 root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  case ${PLOT##*/} in *.*) cp "$results" "${PLOT%.*}.json" ;; *) cp "$results" "$PLOT.json" ;; esac
  "$PLOT_PYTHON" "$root/python/cxlrt/plot.py" -o "$PLOT" --title "$title" "$results"
}
