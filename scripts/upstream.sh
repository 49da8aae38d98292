#!/usr/bin/env bash
# Builds (or reuses) the real Kubernetes components the tests run on 127.0.0.1, from their Go
# modules: kube-apiserver, kube-controller-manager, kube-scheduler, etcd, the KWOK controller,
# Karpenter with its KWOK provider and KEDA (operator and metrics adapter). Versions:
# upstream/versions.env; one wrapper module per upstream project beside it (go.mod + go.sum), except
# KEDA, built in a copy of its own module (its go.mod's replace directives rule out a wrapper). GOTOOLCHAIN=local: a module that needs a newer Go fails here
# instead of fetching a toolchain.
#
# The binaries, and the upstream files the harness applies (KWOK stages, Karpenter and KEDA CRDs), are cached
# outside the checkout in ${XDG_CACHE_HOME:-$HOME/.cache}/kubeon-upstream/<key>, the key hashing the
# versions, the wrappers and the Go version: every clone on a machine shares one build. Progress goes
# to stderr; the last line on stdout is that folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
up="$root/upstream"
# shellcheck source=/dev/null
source "$up/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

command -v go >/dev/null 2>&1 || { echo "upstream.sh: Go >= 1.25 is needed (apt-get install golang-1.25 or the Go toolchain)" >&2; exit 2; }
key="$( { go version; cat "$up/versions.env" "$up"/*/go.mod "$up"/*/go.sum; } | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kubeon-upstream"
out="$cache/$key"
binaries=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok karpenter-kwok keda-operator keda-adapter)

complete() { [ -f "$out/.complete" ]; }
mkdir -p "$cache"
exec 9>"$cache/.lock"
if ! complete; then
  flock -n 9 || { echo "upstream: another build holds $cache/.lock; waiting" >&2; flock 9; }
fi
if complete; then
  echo "upstream: reusing $out" >&2
  echo "$out"
  exit 0
fi

work="$out.partial"
rm -rf "$work"
mkdir -p "$work/bin" "$work/share"
started=$(date +%s)
step() { echo "upstream: [$(( $(date +%s) - started ))s] $*" >&2; }

kv="$KUBERNETES_VERSION"
minor="$(echo "$kv" | cut -d. -f2)"
kube_ld="-s -w -X k8s.io/component-base/version.gitVersion=$kv -X k8s.io/component-base/version.gitMajor=1"
kube_ld+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$kv"
kube_ld+=" -X k8s.io/component-base/version.gitTreeState=clean"

build() {  # build WRAPPER OUTPUT PACKAGE LDFLAGS
  step "building $2 ($3)"
  (cd "$up/$1" && go build -trimpath -ldflags "$4" -o "$work/bin/$2" "$3")
}
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kube_ld"
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ld"
build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kube_ld"
build etcd etcd go.etcd.io/etcd/server/v3 "-s -w"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
build karpenter karpenter-kwok sigs.k8s.io/karpenter/kwok "-s -w"

# KEDA: `go install ...@version` refuses a module with replace directives; its module zip carries
# go.mod and go.sum, so build inside a writable copy of it.
step "downloading github.com/kedacore/keda/v2@$KEDA_VERSION"
keda_src="$(go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
[ -d "$keda_src" ] || { echo "upstream.sh: KEDA $KEDA_VERSION not downloaded" >&2; exit 1; }
keda_build="$work/keda-src"
cp -r "$keda_src" "$keda_build" && chmod -R u+w "$keda_build"
keda_ld="-s -w -X github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION#v}"
for cmd in operator adapter; do
  step "building keda-$cmd (github.com/kedacore/keda/v2/cmd/$cmd)"
  (cd "$keda_build" && go build -trimpath -ldflags "$keda_ld" -o "$work/bin/keda-$cmd" "./cmd/$cmd")
done
mkdir -p "$work/share/keda-crds"
cp "$keda_build"/config/crd/bases/keda.sh_*.yaml "$work/share/keda-crds/"
rm -rf "$keda_build"

step "copying KWOK stages and Karpenter CRDs from the module cache"
modcache="$(go env GOMODCACHE)"
kwok_src="$(cd "$up/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
karp_src="$(cd "$up/karpenter" && go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)"
[ -n "$kwok_src" ] && [ -n "$karp_src" ] || { echo "upstream.sh: module sources not found in $modcache" >&2; exit 1; }
mkdir -p "$work/share/kwok-stages" "$work/share/karpenter-crds"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
         pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  cp "$kwok_src/kustomize/stage/$f" "$work/share/kwok-stages/"
done
cp "$karp_src"/pkg/apis/crds/*.yaml "$karp_src"/kwok/apis/crds/*.yaml "$work/share/karpenter-crds/"
chmod -R u+w "$work/share"

for b in "${binaries[@]}"; do [ -x "$work/bin/$b" ] || { echo "upstream.sh: $b was not built" >&2; exit 1; }; done
{ cat "$up/versions.env"; go version; echo "built_seconds=$(( $(date +%s) - started ))"; } > "$work/VERSIONS"
touch "$work/.complete"
rm -rf "$out"
mv "$work" "$out"
step "built in $out ($(du -sh "$out" | cut -f1))"
echo "$out"
