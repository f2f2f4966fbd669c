#!/usr/bin/env bash
# scripts/python_matrix.sh - gpumem on each CPython given: a wheel built, then
# the tests that need no torch run, one table row per interpreter.
#
#   scripts/python_matrix.sh /root/.pyenv/versions/3.{9,10,12,13}*/bin/python
#   MATRIX_DIR=/tmp/m PYTEST_ARGS="tests/test_history.py" scripts/python_matrix.sh python3.12
#
# Per interpreter X.Y it makes a venv $MATRIX_DIR/pyX.Y (without the system's
# site-packages, so torch is absent and the tests that need it skip),
# installs pytest and numpy, builds a wheel (pip wheel; the compiler's
# warnings are counted from its log), builds gpumem._C in place for that
# version (the tests import gpumem from this tree; each version's extension
# has its own file name) and runs `pytest -m "not slow" tests` (PYTEST_ARGS
# replaces the last part). Logs stay in $MATRIX_DIR. Not run by CI: a run
# takes several minutes per interpreter and needs the network for pip.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
DIR=${MATRIX_DIR:-${TMPDIR:-/tmp}/gpumem-python-matrix}
ARGS=${PYTEST_ARGS:-tests}
mkdir -p "$DIR"
if [ $# -eq 0 ]; then
    echo "usage: $0 PYTHON [PYTHON...] (interpreters to build and test on)" >&2
    exit 2
fi
rows=()
for py in "$@"; do
    ver=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)
    if [ -z "$ver" ]; then
        rows+=("$(printf '%-8s %-14s %s' "?" "-" "$py does not run")")
        continue
    fi
    venv=$DIR/py${ver%.*}
    log=$DIR/py$ver
    rm -rf "$venv"
    "$py" -m venv "$venv" && "$venv/bin/pip" install -q pytest numpy setuptools wheel \
        >"$log.pip.log" 2>&1
    wheel=fail
    if "$venv/bin/pip" wheel -v --no-deps -w "$DIR/wheels" "$ROOT" >"$log.wheel.log" 2>&1; then
        wheel="ok/$(grep -c -E '\.(c|h):[0-9]+:[0-9]+: warning' "$log.wheel.log")w"
    fi
    "$venv/bin/python" setup.py -q build_ext --inplace >"$log.inplace.log" 2>&1 || wheel="$wheel,inplace-fail"
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" $ARGS >"$log.pytest.log" 2>&1
    summary=$(tail -n 1 "$log.pytest.log")
    rows+=("$(printf '%-8s %-14s %s' "$ver" "$wheel" "$summary")")
done
printf '%-8s %-14s %s\n' "CPython" "wheel/warn" "pytest -m 'not slow' $ARGS"
printf '%s\n' "${rows[@]}"
