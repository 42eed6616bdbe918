#!/usr/bin/env bash
# Builds (or reuses) one tool named in hack/tools/versions.env from its Go module and
# prints the binary's path on its last line. Cached in ~/.cache/vnpu-operator/tools/ by
# name and version, so a warm machine builds nothing; a cold build shows progress.
#
#   hack/tools/build.sh promtool        build what is missing, print the path
#   hack/tools/build.sh --print cosign  print the path this checkout pins, build nothing
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
TAG=tools
# shellcheck source=../lib/build-common.sh
source "$here/../lib/build-common.sh"

print_only=0
if [[ "${1:-}" == "--print" ]]; then print_only=1; shift; fi
name=${1:?usage: hack/tools/build.sh [--print] <tool> (one of: $(grep -oE '^[a-z0-9]+=' "$here/versions.env" | tr -d = | tr '\n' ' '))}

spec=$(grep -E "^$name=" "$here/versions.env" | head -1 | cut -d= -f2-) \
  || die "no tool '$name' in hack/tools/versions.env"
[[ -n "$spec" ]] || die "no tool '$name' in hack/tools/versions.env"
# name=pkg@version, then optional Go build tags (comma-separated) after a space.
tags=
if [[ "$spec" == *" "* ]]; then tags=${spec#* }; spec=${spec%% *}; fi
pkg=${spec%@*}
version=${spec##*@}
bin_dir="${VNPU_CACHE:-$HOME/.cache/vnpu-operator}/tools/$name-$version${tags:+-${tags//,/-}}"
binary=$bin_dir/$name

if (( print_only )); then echo "$binary"; exit 0; fi
if need "$name"; then
  command -v go >/dev/null 2>&1 || die "go is missing: the tools are built from their Go modules (https://go.dev/dl)"
  mkdir -p "$bin_dir"
  # One build at a time per tool: parallel test sessions may ask for it together.
  exec 9>"$bin_dir/.lock"
  flock 9
  if need "$name"; then
    log "$name $version from $pkg (a cold build takes minutes on 2 cores)"
    t=$SECONDS
    gobin=$(mktemp -d)
    GOBIN="$gobin" run_build "$name" go install -v -trimpath ${tags:+-tags "$tags"} -ldflags "-s -w" "$pkg@$version"
    mv "$gobin/$(basename "$pkg")" "$binary"
    rm -rf "$gobin"
    log "$name built in $((SECONDS - t))s"
  fi
fi
echo "$binary"
