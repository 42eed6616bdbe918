#!/usr/bin/env bash
# Builds (or reuses) the tooling of the local real node into a versioned
# cache: the kubelet, containerd with ctr and its runc shim, runc, the CNI
# plugins the node's network needs (bridge, host-local, loopback) and a
# static pause binary for the sandbox image.
#
# Where each piece comes from, and why, is in docs/REAL-NODE.md:
#   kubelet      built in the plane's Kubernetes wrapper module (hack/plane/
#                kubernetes) at the plane's version, sharing its Go build cache
#   containerd   `go install` through the Go module proxy
#   runc, CNI    unpacked from Debian packages (apt-get download + dpkg -x),
#                nothing is installed on the system
#   pause        hack/node/pause, a few lines of Go
#   busybox      Debian's busybox-static, for the tests' plain-container image
#                (test-only, so not part of the cache key)
#   cdi-test-plugin  hack/node/cdi-test-plugin, a test-only device plugin whose
#                Allocate answers name CDI devices (not part of the directory
#                name: its file name carries its source hash)
#
# One directory keyed by every version holds them all (CNI plugins under
# cni/); a run with that directory complete builds nothing. Prints the
# directory on its last line.
#
#   hack/node/build.sh            build what is missing, print the dir
#   hack/node/build.sh --print    print the dir, build nothing
#   hack/node/build.sh --print-cdi-test-plugin
#                                 print the test device plugin's path, build nothing
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
plane=$(cd "$here/../plane" && pwd)
# shellcheck source=../plane/versions.env
. "$plane/versions.env"
# shellcheck source=versions.env
. "$here/versions.env"

# The pause binary has no upstream version: its key is its source.
pause_key=$(cat "$here/pause/go.mod" "$here/pause/main.go" | sha256sum | cut -c1-12)
cache_root=${VNPU_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnpu-operator/node}
bin_dir="$cache_root/bin-kubelet-$K8S_VERSION-containerd-$CONTAINERD_VERSION-runc-$RUNC_VERSION-cni-$CNI_PLUGINS_VERSION-pause-$pause_key"
# Test-only like busybox, so it stays out of the directory name; its own
# source hash is in its file name, so a source change builds a new binary.
cdi_plugin_key=$(cat "$here/cdi-test-plugin/go.mod" "$here/cdi-test-plugin/go.sum" "$here/cdi-test-plugin/main.go" | sha256sum | cut -c1-12)
cdi_plugin="cdi-test-plugin-$cdi_plugin_key"

if [[ "${1:-}" == "--print" ]]; then
  echo "$bin_dir"
  exit 0
fi
if [[ "${1:-}" == "--print-cdi-test-plugin" ]]; then
  echo "$bin_dir/$cdi_plugin"
  exit 0
fi

TAG=node
# shellcheck source=../lib/build-common.sh
. "$here/../lib/build-common.sh"

# Succeeds when at least one of the named files is missing from bin_dir.

want_kubelet=0 want_containerd=0 want_pause=0 want_runc=0 want_cni=0
need kubelet && want_kubelet=1
need containerd ctr containerd-shim-runc-v2 && want_containerd=1
need pause && want_pause=1
need runc && want_runc=1
need cni/bridge cni/host-local cni/loopback && want_cni=1
want_busybox=0
need busybox && want_busybox=1
want_cdi_plugin=0
need "$cdi_plugin" && want_cdi_plugin=1

# Tools are checked only when something needs them, so a complete cache
# works on a machine without Go or apt.
if (( want_kubelet + want_containerd + want_pause + want_cdi_plugin > 0 )); then
  command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH. The kubelet, containerd, pause and the test device plugin are built from Go modules; install Go >= 1.26 (https://go.dev/doc/install) and run again."
  go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
  [[ "$go_minor" =~ ^[0-9]+$ ]] && (( go_minor >= 26 )) || die "Go $(go env GOVERSION) is too old: the kubelet $K8S_VERSION needs Go >= 1.26 (containerd $CONTAINERD_VERSION >= 1.25)."
fi
if (( want_runc + want_cni + want_busybox > 0 )); then
  for tool in apt-get apt-cache dpkg-deb; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is not on PATH. runc and the CNI plugins are unpacked from Debian packages; this needs a Debian-family system with apt (nothing is installed, only downloaded)."
  done
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false"


# Records where a binary came from, next to it (docs/REAL-NODE.md lists the
# same; this file says which Debian revision this machine got).
origin() { mkdir -p "$bin_dir/origin"; printf '%s\n' "$2" > "$bin_dir/origin/$1"; }

# Scratch directories of a failed step go with the run.
scratch=()
trap 'rm -rf "${scratch[@]}"' EXIT

mkdir -p "$bin_dir"
start_all=$SECONDS
total=7

step=1
if (( want_kubelet )); then
  log "[$step/$total] kubelet $K8S_VERSION in the plane's wrapper module: about 1 minute when the plane is built, 5 or more on a cold Go cache"
  t=$SECONDS
  grep -q "k8s.io/kubernetes $K8S_VERSION" "$plane/kubernetes/go.mod" \
    || die "hack/plane/kubernetes/go.mod does not require k8s.io/kubernetes $K8S_VERSION (hack/plane/versions.env)."
  # A scratch copy of the wrapper module: the kubelet imports modules whose
  # checksums the plane's go.sum does not list, and the build must add them
  # somewhere other than the repository. Same go.mod, so the same build list
  # and the same compiled packages as the plane's binaries.
  mod=$(mktemp -d "$cache_root/.kubelet-module.XXXXXX")
  scratch+=("$mod" "$bin_dir/kubelet.tmp")
  cp "$plane/kubernetes/go.mod" "$plane/kubernetes/go.sum" "$plane/kubernetes/tools.go" "$mod/"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$mod" && run_build kubelet go build -v -trimpath -ldflags "$ld" -o "$bin_dir/kubelet.tmp" k8s.io/kubernetes/cmd/kubelet)
  # go.sum may grow; go.mod must not, or the kubelet was built against
  # other versions than the plane.
  cmp -s "$mod/go.mod" "$plane/kubernetes/go.mod" \
    || { diff "$plane/kubernetes/go.mod" "$mod/go.mod" >&2 || true; die "building the kubelet changed the wrapper module's requirements (above); add what it needs to hack/plane/kubernetes/go.mod."; }
  rm -rf "$mod"
  mv "$bin_dir/kubelet.tmp" "$bin_dir/kubelet"
  origin kubelet "kubelet $K8S_VERSION: go build k8s.io/kubernetes/cmd/kubelet in the wrapper module hack/plane/kubernetes"
  log "[$step/$total] kubelet built in $((SECONDS - t))s"
else
  log "[$step/$total] kubelet $K8S_VERSION: cached"
fi

step=2
if (( want_containerd )); then
  log "[$step/$total] containerd $CONTAINERD_VERSION (containerd, ctr, containerd-shim-runc-v2): about 2 minutes cold"
  t=$SECONDS
  gobin=$(mktemp -d)
  scratch+=("$gobin")
  pkg=github.com/containerd/containerd/v2
  # The tags leave out snapshotters that need cgo or kernel features this
  # node does not use; overlayfs and native stay in.
  (cd "$gobin" && GOBIN="$gobin" run_build containerd go install -v -trimpath \
      -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X $pkg/version.Version=$CONTAINERD_VERSION -X $pkg/version.Package=$pkg" \
      "$pkg/cmd/containerd@$CONTAINERD_VERSION" \
      "$pkg/cmd/ctr@$CONTAINERD_VERSION" \
      "$pkg/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION")
  for b in containerd ctr containerd-shim-runc-v2; do mv "$gobin/$b" "$bin_dir/$b"; done
  rm -rf "$gobin"
  origin containerd "containerd, ctr, containerd-shim-runc-v2 $CONTAINERD_VERSION: go install $pkg/cmd/...@$CONTAINERD_VERSION (CGO_ENABLED=0, tags no_btrfs no_devmapper no_zfs)"
  log "[$step/$total] containerd built in $((SECONDS - t))s"
else
  log "[$step/$total] containerd $CONTAINERD_VERSION: cached"
fi

step=3
if (( want_pause )); then
  log "[$step/$total] pause (hack/node/pause, source $pause_key)"
  t=$SECONDS
  (cd "$here/pause" && run_build pause go build -v -trimpath -ldflags "-s -w" -o "$bin_dir/pause.tmp" .)
  mv "$bin_dir/pause.tmp" "$bin_dir/pause"
  origin pause "pause: go build hack/node/pause (source $pause_key, CGO_ENABLED=0)"
  log "[$step/$total] pause built in $((SECONDS - t))s"
else
  log "[$step/$total] pause $pause_key: cached"
fi

apt_updated=0
# apt-get update, once per run, only when the package lists are missing or
# stale; it writes /var/lib/apt/lists, so it needs root.
apt_update() {
  (( apt_updated )) && return 0
  [[ $(id -u) -eq 0 ]] || die "the apt package lists need refreshing ('apt-get update'), which needs root; run 'sudo apt-get update' and run again."
  log "  apt-get update"
  apt-get update -qq >&2 || die "apt-get update failed (above)."
  apt_updated=1
}

# Downloads one Debian package into a fresh directory and unpacks it there
# (dpkg -x: no install, no maintainer scripts); sets deb_dir and deb_version.
# Refuses an upstream version other than the pinned one, since the cache key
# names that version.
fetch_deb() {
  local name=$1 upstream=$2 candidate deb up
  candidate=$(apt-cache policy "$name" 2>/dev/null | awk '/Candidate:/ {print $2}')
  [[ -n "$candidate" && "$candidate" != "(none)" ]] || apt_update
  deb_dir=$(mktemp -d)
  scratch+=("$deb_dir")
  # apt's download sandbox user (_apt) must be able to write here.
  chmod 0777 "$deb_dir"
  if ! (cd "$deb_dir" && apt-get download -qq "$name" >&2); then
    # Lists older than the archive name files that are gone: refresh, retry.
    apt_update
    (cd "$deb_dir" && apt-get download -qq "$name" >&2) || die "apt-get download $name failed (above); is a Debian archive with '$name' configured in /etc/apt/sources.list*?"
  fi
  deb=$(ls "$deb_dir"/*.deb)
  deb_version=$(dpkg-deb -f "$deb" Version)
  # A Debian version reads [epoch:]upstream[+repack][-revision].
  up=${deb_version#*:}
  up=${up%%[+~-]*}
  [[ "$up" == "$upstream" ]] || die "Debian offers $name $deb_version, upstream $up; hack/node/versions.env pins $upstream. Change the pin (it is part of the cache key) after checking the node still works with it."
  dpkg-deb -x "$deb" "$deb_dir/root"
}

step=4
if (( want_runc )); then
  log "[$step/$total] runc $RUNC_VERSION from Debian"
  t=$SECONDS
  fetch_deb runc "$RUNC_VERSION"
  [[ -x "$deb_dir/root/usr/sbin/runc" ]] || die "the runc package $deb_version has no usr/sbin/runc."
  cp "$deb_dir/root/usr/sbin/runc" "$bin_dir/runc.tmp" && mv "$bin_dir/runc.tmp" "$bin_dir/runc"
  rm -rf "$deb_dir"
  origin runc "runc $deb_version: Debian package runc (apt-get download, dpkg -x)"
  log "[$step/$total] runc $deb_version unpacked in $((SECONDS - t))s"
else
  log "[$step/$total] runc $RUNC_VERSION: cached"
fi

step=5
if (( want_cni )); then
  log "[$step/$total] CNI plugins $CNI_PLUGINS_VERSION (bridge, host-local, loopback) from Debian"
  t=$SECONDS
  fetch_deb containernetworking-plugins "$CNI_PLUGINS_VERSION"
  mkdir -p "$bin_dir/cni"
  for p in bridge host-local loopback; do
    [[ -x "$deb_dir/root/usr/lib/cni/$p" ]] || die "the containernetworking-plugins package $deb_version has no usr/lib/cni/$p."
    cp "$deb_dir/root/usr/lib/cni/$p" "$bin_dir/cni/$p.tmp" && mv "$bin_dir/cni/$p.tmp" "$bin_dir/cni/$p"
  done
  rm -rf "$deb_dir"
  origin cni "bridge, host-local, loopback $deb_version: Debian package containernetworking-plugins (apt-get download, dpkg -x)"
  log "[$step/$total] CNI plugins $deb_version unpacked in $((SECONDS - t))s"
else
  log "[$step/$total] CNI plugins $CNI_PLUGINS_VERSION: cached"
fi

step=6
if (( want_busybox )); then
  log "[$step/$total] busybox $BUSYBOX_VERSION (static, the tests' plain-container image) from Debian"
  t=$SECONDS
  fetch_deb busybox-static "$BUSYBOX_VERSION"
  [[ -x "$deb_dir/root/bin/busybox" ]] || die "the busybox-static package $deb_version has no bin/busybox."
  cp "$deb_dir/root/bin/busybox" "$bin_dir/busybox.tmp" && mv "$bin_dir/busybox.tmp" "$bin_dir/busybox"
  rm -rf "$deb_dir"
  origin busybox "busybox $deb_version: Debian package busybox-static (apt-get download, dpkg -x)"
  log "[$step/$total] busybox $deb_version unpacked in $((SECONDS - t))s"
else
  log "[$step/$total] busybox $BUSYBOX_VERSION: cached"
fi

step=7
if (( want_cdi_plugin )); then
  log "[$step/$total] CDI test device plugin (hack/node/cdi-test-plugin, source $cdi_plugin_key)"
  t=$SECONDS
  (cd "$here/cdi-test-plugin" && run_build cdi-test-plugin go build -v -trimpath -ldflags "-s -w" -o "$bin_dir/$cdi_plugin.tmp" .)
  # Binaries of older sources are never used again.
  find "$bin_dir" -maxdepth 1 -name 'cdi-test-plugin-*' ! -name "$cdi_plugin.tmp" -delete
  mv "$bin_dir/$cdi_plugin.tmp" "$bin_dir/$cdi_plugin"
  origin cdi-test-plugin "$cdi_plugin: go build hack/node/cdi-test-plugin (k8s.io/kubelet device-plugin API v1beta1, CGO_ENABLED=0)"
  log "[$step/$total] CDI test device plugin built in $((SECONDS - t))s"
else
  log "[$step/$total] CDI test device plugin $cdi_plugin_key: cached"
fi

# Every run: each binary starts on this host. runc from Debian links
# libseccomp dynamically, so a host without it fails here, not at the first
# pod sandbox.
"$bin_dir/kubelet" --version >/dev/null 2>&1 || die "$bin_dir/kubelet does not run."
"$bin_dir/containerd" --version >/dev/null 2>&1 || die "$bin_dir/containerd does not run."
"$bin_dir/ctr" --version >/dev/null 2>&1 || die "$bin_dir/ctr does not run."
"$bin_dir/containerd-shim-runc-v2" -v >/dev/null 2>&1 || die "$bin_dir/containerd-shim-runc-v2 does not run."
"$bin_dir/runc" --version >/dev/null 2>&1 || die "$bin_dir/runc does not run: $("$bin_dir/runc" --version 2>&1 | head -1). Debian's runc needs libseccomp2 ('apt-get install libseccomp2')."
"$bin_dir/busybox" true || die "$bin_dir/busybox does not run."
"$bin_dir/$cdi_plugin" -h 2>/dev/null || die "$bin_dir/$cdi_plugin does not run."
for p in bridge host-local loopback; do
  CNI_COMMAND=VERSION "$bin_dir/cni/$p" </dev/null >/dev/null 2>&1 || die "$bin_dir/cni/$p does not run."
done

log "all node tools ready in $bin_dir ($((SECONDS - start_all))s)"
echo "$bin_dir"
