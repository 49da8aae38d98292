#!/usr/bin/env bash
# Regenerate tests/kubeapi/proto/ (the Kubernetes protobuf messages the test API server speaks)
# from upstream's generated.proto files.
#
#   scripts/gen-kubeapi-proto.sh API_REPO APIMACHINERY_REPO [TAG]
#
# API_REPO / APIMACHINERY_REPO: git checkouts (or bare git dirs) of github.com/kubernetes/api and
# github.com/kubernetes/apimachinery; TAG defaults to the one the vendored files came from.
# Writes, under tests/kubeapi/proto/: src/k8s.io/**/generated.proto (the upstream files, Apache-2.0),
# k8s/io/**/generated_pb2.py (protoc output via grpcio-tools, imports rewritten to this package) and
# gofields.json (per message: the JSON name, pointer-ness, omitempty and inlining of each field, read
# from the Go types beside each .proto: protobuf alone cannot say how Kubernetes writes JSON).
set -euo pipefail
API=${1:?kubernetes/api checkout}
MACH=${2:?kubernetes/apimachinery checkout}
TAG=${3:-v0.35.7}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/tests/kubeapi/proto
APIGROUPS="core/v1 apps/v1 policy/v1 autoscaling/v1 autoscaling/v2 batch/v1 rbac/v1 coordination/v1 events/v1
        scheduling/v1 admissionregistration/v1"
MACHINERY="pkg/api/resource pkg/apis/meta/v1 pkg/runtime pkg/runtime/schema pkg/util/intstr"

rm -rf "$OUT/src" "$OUT/k8s" "$OUT/gofields.json"
gotypes=$(mktemp -d)
trap 'rm -rf "$gotypes"' EXIT
copy() {  # repo dir dest-prefix
  local repo=$1 dir=$2 dest=$3
  mkdir -p "$OUT/src/$dest/$dir" "$gotypes/$dest/$dir"
  git -C "$repo" show "$TAG:$dir/generated.proto" > "$OUT/src/$dest/$dir/generated.proto"
  for f in $(git -C "$repo" ls-tree --name-only "$TAG" "$dir/" | grep '\.go$' | grep -v '_test.go$\|generated\|zz_'); do
    git -C "$repo" show "$TAG:$f" > "$gotypes/$dest/$f"
  done
}
for g in $APIGROUPS; do copy "$API" "$g" k8s.io/api; done
for m in $MACHINERY; do copy "$MACH" "$m" k8s.io/apimachinery; done
{
  echo "Upstream generated.proto files, Apache-2.0 (LICENSE beside), unchanged:"
  echo "  k8s.io/api          github.com/kubernetes/api          $TAG $(git -C "$API" rev-list -n1 "$TAG")"
  echo "  k8s.io/apimachinery github.com/kubernetes/apimachinery $TAG $(git -C "$MACH" rev-list -n1 "$TAG")"
} > "$OUT/src/SOURCE"
git -C "$API" show "$TAG:LICENSE" > "$OUT/src/LICENSE"

cd "$OUT/src"
python3 -m grpc_tools.protoc -I. --python_out="$OUT" $(find k8s.io -name generated.proto | sort) \
  2> >(grep -v "is unused" >&2)
cd "$OUT"
find k8s -type d -exec touch {}/__init__.py \;  # protoc writes k8s/io/...: packages for import
find k8s -name '*_pb2.py' -exec sed -i 's/^from k8s\.io\./from tests.kubeapi.proto.k8s.io./' {} +
python3 - "$gotypes" > "$OUT/gofields.json" <<'PY'
"""Per proto message, how Go marshals each field to JSON: {message: {protoField: [jsonName, flags]}}.
flags: p = pointer, o = omitempty, z = omitzero, i = inline; messages for named slice types (`type Verbs
[]string`, proto `repeated items`) get {"": ["items", "slice"]}."""
import json, os, re, sys
root = sys.argv[1]
out = {}
field = re.compile(r'^\s+(?:(\w+)\s+)?(\*?)([\w.\[\]*]+)\s+`json:"([^"]*)"[^`]*protobuf:"([^"]*)"')
for dirpath, _, files in os.walk(root):
    rel = os.path.relpath(dirpath, root)
    pkg = rel.replace("/", ".")
    for name in sorted(files):
        current = None
        for line in open(os.path.join(dirpath, name)):
            m = re.match(r'^type (\w+) struct \{', line)
            if m:
                current = f"{pkg}.{m.group(1)}"
                continue
            m = re.match(r'^type (\w+) \[\]', line)
            if m:
                out.setdefault(f"{pkg}.{m.group(1)}", {})[""] = ["items", "slice"]
                continue
            if line.startswith("}"):
                current = None
                continue
            m = field.match(line)
            if current and m:
                _, ptr, gotype, jtag, ptag = m.groups()
                jparts = jtag.split(",")
                pname = dict(p.split("=", 1) for p in ptag.split(",") if "=" in p).get("name")
                if not pname:
                    continue
                flags = ("p" if ptr else "") + ("o" if "omitempty" in jparts[1:] else "") + \
                        ("z" if "omitzero" in jparts[1:] else "") + ("i" if "inline" in jparts[1:] else "")
                out.setdefault(current, {})[pname] = [jparts[0], flags]
json.dump(out, sys.stdout, indent=0, sort_keys=True)
PY
echo "wrote $OUT"
