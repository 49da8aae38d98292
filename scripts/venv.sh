#!/usr/bin/env bash
# The virtual environment both README commands install into: .venv/ in the checkout (Debian's own
# python3 refuses `pip install` outside one: PEP 668, "externally-managed-environment").
# Makes it with python3 when it is missing or no longer runs; a python3 without the venv module
# (Debian without python3-venv) gets the package from apt when run as root, else one line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import pip" >/dev/null 2>&1; then
  exit 0
fi
if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  else
    echo "scripts/venv.sh: $(command -v python3) cannot make a virtual environment: install python3-venv (sudo apt-get install python3-venv)" >&2
    exit 2
  fi
fi
python3 -m venv --clear "$venv"
