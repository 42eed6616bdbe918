#!/usr/bin/env bash
# Builds the local control plane's binaries from their Go modules into a
# versioned cache: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok, helm and kubeconform.
#
# Two Kubernetes lanes (versions.env): the main one, K8S_VERSION, whose
# directory holds every binary, and the older one, K8S_LEGACY_VERSION, whose
# directory holds only its own kube-apiserver, kube-controller-manager and
# kube-scheduler (the components whose version the tests of the annotation
# path depend on) next to links to the main lane's etcd, kubectl, kwok, helm
# and kubeconform. Each lane's Kubernetes is built in its own wrapper module:
# hack/plane/kubernetes (main) and hack/plane/kubernetes-<major.minor>.
#
# Each component lands in a directory keyed by its version, so a second run
# (or a version bump of one component) rebuilds only what is missing. Prints
# the lane's bin directory on its last line.
#
#   hack/plane/build.sh                 build the main lane, print its bin dir
#   hack/plane/build.sh --lane 1.34     build the main lane and the 1.34 lane, print the 1.34 one
#   hack/plane/build.sh --all           build both lanes (`make plane`), print the main one
#   hack/plane/build.sh [--lane X] --print   print the bin dir, build nothing
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

minor_of() { echo "$1" | sed -E 's/^v([0-9]+)\.([0-9]+)\..*/\1.\2/'; }
main_lane=$(minor_of "$K8S_VERSION")
legacy_lane=$(minor_of "$K8S_LEGACY_VERSION")

lane=$main_lane print=0 all=0
while (( $# )); do
  case "$1" in
    --print) print=1 ;;
    --all) all=1 ;;
    --lane) lane=${2:?--lane needs a version such as $legacy_lane}; shift ;;
    --lane=*) lane=${1#--lane=} ;;
    *) echo "usage: $0 [--lane $main_lane|$legacy_lane] [--all] [--print]" >&2; exit 2 ;;
  esac
  shift
done
[[ "$lane" == "$main_lane" || "$lane" == "$legacy_lane" ]] \
  || { echo "[plane] error: no Kubernetes lane $lane; versions.env has $main_lane (K8S_VERSION) and $legacy_lane (K8S_LEGACY_VERSION)" >&2; exit 2; }

cache_root=${VNPU_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnpu-operator/plane}
bin_dir="$cache_root/bin-k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
main_bin_dir=$bin_dir
legacy_bin_dir="$cache_root/bin-k8s-$K8S_LEGACY_VERSION-server"

if (( print )); then
  if [[ "$lane" == "$main_lane" ]]; then echo "$main_bin_dir"; else echo "$legacy_bin_dir"; fi
  exit 0
fi
if [[ "$lane" == "$legacy_lane" && "$legacy_lane" != "$main_lane" ]]; then
  all=1
fi

TAG=plane
# shellcheck source=../lib/build-common.sh
. "$here/../lib/build-common.sh"

command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH. The control plane is built from Go modules; install Go >= 1.24 (https://go.dev/doc/install or 'apt-get install golang') and run again."

go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
[[ "$go_minor" =~ ^[0-9]+$ ]] && (( go_minor >= 26 )) || die "Go $(go env GOVERSION) is too old: Kubernetes $main_lane needs Go >= 1.26."

legacy_module="$here/kubernetes-$legacy_lane"
grep -q "k8s.io/kubernetes $K8S_VERSION" "$here/kubernetes/go.mod" \
  || die "hack/plane/kubernetes/go.mod does not require k8s.io/kubernetes $K8S_VERSION (versions.env); update its require and replace lines."
grep -q "k8s.io/kubernetes $K8S_LEGACY_VERSION" "$legacy_module/go.mod" \
  || die "hack/plane/kubernetes-$legacy_lane/go.mod does not require k8s.io/kubernetes $K8S_LEGACY_VERSION (versions.env K8S_LEGACY_VERSION)."
grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION" "$here/etcd/go.mod" \
  || die "hack/plane/etcd/go.mod does not require etcd $ETCD_VERSION (versions.env)."

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false"


mkdir -p "$bin_dir"
start_all=$SECONDS
step=0
total=5
(( all )) && total=6


# Builds Kubernetes $1's commands (the rest of the arguments, under
# k8s.io/kubernetes/cmd/) in the wrapper module $2 into $bin_dir.
build_kubernetes() {
  local version=$1 module=$2; shift 2
  local minor ld p tmp_out pkgs=()
  minor=$(echo "$version" | cut -d. -f2)
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for p in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$p"); done
  tmp_out="$bin_dir/.k8s-tmp"
  rm -rf "$tmp_out"; mkdir -p "$tmp_out"
  (cd "$module" && run_build "kubernetes $version" go build -v -trimpath -ldflags "$ld" -o "$tmp_out/" "${pkgs[@]}")
  mv "$tmp_out"/* "$bin_dir/" && rmdir "$tmp_out"
}

step=$((step + 1))
if need kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  log "[$step/$total] kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl): cold builds take 15-30 minutes on 2 cores"
  t=$SECONDS
  build_kubernetes "$K8S_VERSION" "$here/kubernetes" kube-apiserver kube-controller-manager kube-scheduler kubectl
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

log "all binaries of the $main_lane lane ready in $bin_dir ($((SECONDS - start_all))s)"

if (( ! all )) || [[ "$legacy_lane" == "$main_lane" ]]; then
  echo "$main_bin_dir"
  exit 0
fi

# The legacy lane: its own API server, controller-manager and scheduler; the
# rest are the main lane's (links, remade every run so they follow a bump).
bin_dir=$legacy_bin_dir
mkdir -p "$bin_dir"
step=$((step + 1))
if need kube-apiserver kube-controller-manager kube-scheduler; then
  log "[$step/$total] kubernetes $K8S_LEGACY_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler), the $legacy_lane lane: cold builds take 10-20 minutes on 2 cores"
  t=$SECONDS
  build_kubernetes "$K8S_LEGACY_VERSION" "$legacy_module" kube-apiserver kube-controller-manager kube-scheduler
  log "[$step/$total] kubernetes $K8S_LEGACY_VERSION built in $((SECONDS - t))s"
else
  log "[$step/$total] kubernetes $K8S_LEGACY_VERSION: cached"
fi
for b in etcd kubectl kwok helm kubeconform; do
  ln -sfn "$main_bin_dir/$b" "$bin_dir/$b"
done
log "the $legacy_lane lane ready in $bin_dir"
if [[ "$lane" == "$legacy_lane" ]]; then echo "$legacy_bin_dir"; else echo "$main_bin_dir"; fi
