#!/usr/bin/env bash
# GPU checks on a machine with its own torch and no registry access.
# Usage: scripts/gpu_check.sh [OUTDIR]   (default: ${GPU_RESULTS:-gpu-results})
# Every step runs even if an earlier one failed; the exit status is nonzero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-${GPU_RESULTS:-gpu-results}}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
failed=()

step() {  # step NAME CMD...: run CMD, tee its output to $OUT/NAME.log, remember a failure
    local name="$1"; shift
    echo "== $name: $*" | tee "$OUT/$name.log"
    "$@" 2>&1 | tee -a "$OUT/$name.log"
    local rc="${PIPESTATUS[0]}"
    echo "== $name: exit $rc" | tee -a "$OUT/$name.log"
    [ "$rc" -eq 0 ] || failed+=("$name($rc)")
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    nvidia-smi 2>&1 || echo "nvidia-smi failed"
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' 2>&1
    "$PY" -c 'import cuda.bindings; print("cuda-bindings", getattr(cuda.bindings, "__version__", "?"))' 2>&1 || echo "cuda-bindings: not installed"
} > "$OUT/env.txt"

# Editable install; failure is fine when the package is already importable.
"$PY" -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 \
    || echo "pip install -e . failed (ignored; see $OUT/install.log)"

# Offline wheels (hypothesis, nvtx, ...) when someone put them next to the checkout.
wheels=()
for dir in shared/wheels wheels; do
    [ -d "$dir" ] && for w in "$dir"/*.whl; do [ -e "$w" ] && wheels+=("$w"); done
done
if [ "${#wheels[@]}" -gt 0 ]; then
    step wheels "$PY" -m pip install --no-deps --no-index "${wheels[@]}"
fi

step pytest_cuda "$PY" -m pytest -q -m cuda tests --junitxml="$OUT/junit-cuda.xml"

for bench in bench_graphs bench_organize bench_reload; do
    if [ -f "scripts/$bench.py" ]; then
        step "$bench" "$PY" "scripts/$bench.py" --json "$OUT/$bench.json"
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "gpu_check: failed steps: ${failed[*]} (results in $OUT)" >&2
    exit 1
fi
echo "gpu_check: all steps passed (results in $OUT)"
