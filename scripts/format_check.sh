#!/bin/bash
# Usage: format_check.sh SOURCE_DIR
# Fails when a C++ or CUDA source of the project differs from what
# clang-format makes of it with the project's .clang-format (STYLE.md:
# Google style, column 100), naming each file and the first lines that
# differ. Fix with: clang-format -i FILE (or every file:
#   git ls-files '*.cc' '*.h' '*.cu' | xargs clang-format -i).
set -euo pipefail
cd "$1"
if ! command -v clang-format >/dev/null; then
  echo "clang-format is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.cc' '*.h' '*.cu' '*.cuh')
else  # an unpacked archive
  mapfile -t files < <(find . -path ./build -prune -o -path ./.venv -prune -o \
    \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print | sort)
fi
bad=0
for f in "${files[@]}"; do
  [ -f "$f" ] || continue  # deleted in the work tree, not yet committed
  if ! out=$(clang-format --style=file "$f" | diff -u "$f" - ); then
    echo "$f is not clang-formatted:"
    head -20 <<<"$out"
    bad=$((bad + 1))
  fi
done
echo "${#files[@]} files checked, $bad not formatted"
[ "$bad" -eq 0 ]
