#!/usr/bin/env bash
# One GPU measurement run (docs/performance.md, "Measuring on a GPU"); arguments go to
# scripts/gpu_report.py (--only PHASE, --json PATH, --budget-scale X, --dry-run).
#
# Runs from the repository root with the checkout importable (no install needed). When the
# machine has no package index, the `gguf` package (the GGUF tests' oracle) is installed from a
# carried wheel, ${WHEELS:-.whl}/gguf-*.whl, into a temporary folder; without it those tests skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! "$PY" -c "import gguf" 2>/dev/null; then
    wheel=$(ls "${WHEELS:-.whl}"/gguf-*.whl 2>/dev/null | head -n 1 || true)
    if [ -n "$wheel" ]; then
        site=$(mktemp -d /tmp/gpu_report_site.XXXXXX)
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel"
        export PYTHONPATH="$PYTHONPATH:$site"
    else
        echo "gpu_report.sh: gguf is not installed and no ${WHEELS:-.whl}/gguf-*.whl was carried;" \
             "the GGUF gpu tests will skip" >&2
    fi
fi
exec "$PY" scripts/gpu_report.py "$@"
