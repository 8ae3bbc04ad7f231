#!/usr/bin/env bash
# Creates ./.venv with redline installed (editable); `--test` adds the test tools.
# Idempotent: reinstalls only when pyproject.toml or requirements.lock changed. Needs Python 3.11+ and nothing else.
set -euo pipefail
cd "$(dirname "$0")"

extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python=$candidate; break; fi
  done
fi
if [ -z "$python" ] || ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup.sh: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)" >&2
  exit 2
fi
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "setup.sh: the venv module is missing; on Debian/Ubuntu: apt-get install python3-venv" >&2
  exit 2
fi

# WordNet 3.0 for the WordNet attack recipes (PWWS, toxictrap-wordnet-*), from Debian's packages.
if [ ! -f /usr/share/wordnet/data.noun ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup.sh: installing WordNet 3.0 (apt: wordnet-base wordnet-sense-index)" >&2
    apt-get install -y -qq wordnet-base wordnet-sense-index >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq wordnet-base wordnet-sense-index >/dev/null; }
  else
    echo "setup.sh: WordNet recipes need: sudo apt-get install wordnet-base wordnet-sense-index" >&2
  fi
fi

# Headless Chromium and its driver for the viewer's browser tests (`--test` only), from Debian's packages.
if [ -n "$extras" ] && ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup.sh: installing headless Chromium for the browser tests (apt: chromium chromium-driver)" >&2
    apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium chromium-driver >/dev/null; }
  else
    echo "setup.sh: the viewer's browser tests need: sudo apt-get install chromium chromium-driver" >&2
  fi
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=".venv/.redline-setup-$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)"
if [ -f "$stamp-test" ] || { [ -z "$extras" ] && [ -f "$stamp" ]; }; then
  exit 0
fi
echo "setup.sh: installing redline$extras into .venv (first time: a few minutes)" >&2
# The CPU wheel of torch, pinned here rather than in pyproject.toml (which declares the range that works):
# an unpinned install pulls a multi-GB CUDA build, and a pin in pyproject would fight a GPU image's own torch.
# TORCH_SPEC overrides it (e.g. TORCH_SPEC="torch==2.11.0" with a CUDA index on a GPU machine).
# requirements.lock (written by .ci/lock.py) holds every runtime dependency at the version the image
# installs: as constraints here, CI and the image run the same versions.
# pip byte-compiles one file at a time (~1 min for ~26k files on 2 cores); compileall does it on every core.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -c requirements.lock \
  "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -c requirements.lock -e ".$extras"
.venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null 2>&1 || true  # a file of Python 2 syntax is not an error
rm -f .venv/.redline-setup-*
touch "$stamp${extras:+-test}"
