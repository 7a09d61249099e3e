#!/bin/sh
# Prove one Python version: install this checkout with the MLX engine (no torch) into a fresh venv,
# then answer the demo prompt from outside the repository. `smoke_python.sh python3.10`
set -eu
python=$1
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$(mktemp -d)/venv
"$python" -m venv "$venv"
"$venv/bin/pip" install -q "$repo[mlx]"
cd "$(dirname "$venv")"
answer=$(OMP_NUM_THREADS=1 "$venv/bin/dflash" generate --engine mlx "What is 48 + 75?" 2>/dev/null)
version=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
rm -rf "$(dirname "$venv")"
case "$answer" in
  *123*) echo "python $version: ok ($answer)" ;;
  *) echo "python $version: wrong answer: $answer" >&2; exit 1 ;;
esac
