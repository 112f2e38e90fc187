#!/usr/bin/env bash
# One GPU measurement run (docs/performance.md, "Measuring on a GPU"); arguments go to
# scripts/gpu_report.py (--only PHASE, --json PATH, --budget-scale X, --dry-run).
#
# Runs from the repository root with the checkout importable (no install needed). Packages the
# machine lacks and cannot fetch (no package index) travel as wheels in ${WHEELS:-.whl}/: `gguf`
# (the GGUF tests' oracle; without it those tests skip), `fla-core` (fla's GDN anchor; without it
# those rows skip). Each is installed without dependencies into a temporary folder placed after
# the machine's own packages, so an installed package always wins over a carried one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
wheels=$(ls "${WHEELS:-.whl}"/*.whl 2>/dev/null || true)
if [ -n "$wheels" ]; then
    site=$(mktemp -d /tmp/gpu_report_site.XXXXXX)
    # shellcheck disable=SC2086 # one path per word
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" $wheels
    export PYTHONPATH="$PYTHONPATH:$site"
fi
"$PY" -c "import gguf" 2>/dev/null || echo "gpu_report.sh: gguf is not installed and no" \
    "${WHEELS:-.whl}/gguf-*.whl was carried: the GGUF gpu tests will skip" >&2
exec "$PY" scripts/gpu_report.py "$@"
