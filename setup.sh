#!/usr/bin/env bash
# One set-up command for a fresh machine: gpumem (editable, with the C
# extension and the simulated GPU), its test extra (pytest, torch 2.14.1's
# CUDA build for the integration tests), and Debian's chromium for the
# viewer's browser test (best effort: skipped without apt-get or root; the
# browser test then skips with a reason).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
            || echo "setup.sh: chromium could not be installed; the viewer's browser test will skip" >&2
    else
        echo "setup.sh: no chromium and no root apt-get; the viewer's browser test will skip" >&2
    fi
fi

python -m pip install -e '.[test]'
