#!/usr/bin/env bash
# Builds the local control plane's binaries from their Go modules into a
# versioned cache: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok, helm and kubeconform.
#
# Each component lands in its own directory keyed by its version, so a
# second run (or a version bump of one component) rebuilds only what is
# missing. Prints the bin directory holding all binaries on its last line.
#
#   hack/plane/build.sh            build what is missing, print the bin dir
#   hack/plane/build.sh --print    print the bin dir, build nothing
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

cache_root=${VNPU_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnpu-operator/plane}
bin_dir="$cache_root/bin-k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"

if [[ "${1:-}" == "--print" ]]; then
  echo "$bin_dir"
  exit 0
fi

TAG=plane
# shellcheck source=../lib/build-common.sh
. "$here/../lib/build-common.sh"

command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH. The control plane is built from Go modules; install Go >= 1.24 (https://go.dev/doc/install or 'apt-get install golang') and run again."

go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
[[ "$go_minor" =~ ^[0-9]+$ ]] && (( go_minor >= 24 )) || die "Go $(go env GOVERSION) is too old: Kubernetes 1.34 needs Go >= 1.24."

grep -q "k8s.io/kubernetes $K8S_VERSION" "$here/kubernetes/go.mod" \
  || die "hack/plane/kubernetes/go.mod does not require k8s.io/kubernetes $K8S_VERSION (versions.env); update its require and replace lines."
grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION" "$here/etcd/go.mod" \
  || die "hack/plane/etcd/go.mod does not require etcd $ETCD_VERSION (versions.env)."

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false"


mkdir -p "$bin_dir"
start_all=$SECONDS
step=0
total=5


step=$((step + 1))
if need kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  log "[$step/$total] kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl): cold builds take 15-30 minutes on 2 cores"
  t=$SECONDS
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  tmp_out="$bin_dir/.k8s-tmp"
  rm -rf "$tmp_out"; mkdir -p "$tmp_out"
  (cd "$here/kubernetes" && run_build kubernetes go build -v -trimpath -ldflags "$ld" -o "$tmp_out/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubectl)
  mv "$tmp_out"/* "$bin_dir/" && rmdir "$tmp_out"
  log "[$step/$total] kubernetes built in $((SECONDS - t))s"
else
  log "[$step/$total] kubernetes $K8S_VERSION: cached"
fi

step=$((step + 1))
if need etcd; then
  log "[$step/$total] etcd $ETCD_VERSION"
  t=$SECONDS
  (cd "$here/etcd" && run_build etcd go build -v -trimpath -ldflags "-s -w" -o "$bin_dir/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$bin_dir/etcd.tmp" "$bin_dir/etcd"
  log "[$step/$total] etcd built in $((SECONDS - t))s"
else
  log "[$step/$total] etcd $ETCD_VERSION: cached"
fi

# Tools whose modules have no replace directives install as they are.
install_tool() {
  local name=$1 pkg=$2 version=$3 stamp=${4:-}
  step=$((step + 1))
  if need "$name"; then
    log "[$step/$total] $name $version"
    local t=$SECONDS gobin
    gobin=$(mktemp -d)
    GOBIN="$gobin" run_build "$name" go install -v -trimpath -ldflags "-s -w ${stamp:+-X $stamp=$version}" "$pkg@$version"
    mv "$gobin/$name" "$bin_dir/$name"
    rm -rf "$gobin"
    log "[$step/$total] $name built in $((SECONDS - t))s"
  else
    log "[$step/$total] $name $version: cached"
  fi
}

# Version stamps: helm checks its own version against charts' helmVersion.
install_tool kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/pkg/consts.Version
install_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" helm.sh/helm/v3/internal/version.version
install_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION"

log "all binaries ready in $bin_dir ($((SECONDS - start_all))s)"
echo "$bin_dir"
