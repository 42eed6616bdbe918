#!/usr/bin/env bash
# Builds the product image without Docker, from `Dockerfile` itself: the recipe users run
# with `docker build` is run here instruction by instruction in chroots (image/build.py),
# with its `debian:<suite>-slim` base made from Debian's packages by mmdebstrap. Writes an
# OCI image layout archive (oci-layout, index.json, blobs) named
# docker.io/library/vnpu-operator:<version>-<hash> by its io.containerd.image.name
# annotation, for `ctr images import`. Before it enters the cache, the archive is unpacked
# into a fresh root where both entrypoints must start (--help) as the image's user on a
# read-only root, with the config the Dockerfile declares.
#
# Cached in ~/.cache/vnpu-operator/images/ by a hash of its inputs (Dockerfile,
# .dockerignore, every file the COPYs take, this builder); the base stage is cached too, so
# a source change rebuilds only the project's stages. Prints the archive path on its last
# line.
#
#   hack/image/build.sh              build what is missing (root), print the archive path
#   hack/image/build.sh --print      print the archive path this tree gives, build nothing
#   hack/image/build.sh --no-cache   rebuild every stage, base included (fresh packages)
#   hack/image/build.sh --platform linux/arm64   for Kunpeng hosts, from an amd64 one: the
#     arm64 base from Debian's packages, RUN and the check under qemu-user (the Debian
#     packages qemu-user-static, binfmt-support and arch-test, installed if missing)
#   hack/image/build.sh --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(git log -1 --format=%cI)   a release's labels, as docker build's
#   SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) ...  the config's `created` (else now)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null \
  || die "Python >= 3.11 is required to run the builder (found '$python'); point PYTHON at one"
export PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}"

build() { "$python" -m image.build "$@"; }

# A cache hit needs neither root nor mmdebstrap.
if [[ " $* " == *" --print "* ]]; then
  build "$@"
  exit
fi
if [[ " $* " != *" --no-cache "* ]]; then
  archive=$(build --print "$@")
  if [[ -f "$archive" ]]; then
    build "$@"
    exit
  fi
fi

[[ $(id -u) == 0 ]] \
  || die "building the image needs root (mmdebstrap makes the Debian base, RUN steps run in chroots, the check mounts /proc): run 'sudo make image', or as root"
for tool in unshare chroot mount tar gzip flock; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (util-linux, coreutils, tar, gzip)"
done
if ! command -v mmdebstrap >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 \
    || die "mmdebstrap is missing and this host has no apt-get: install mmdebstrap (a Debian package; https://gitlab.mister-muffin.de/josch/mmdebstrap) and run again"
  log "installing mmdebstrap (Debian package): it makes the image's Debian base"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends mmdebstrap >&2; then
    apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends mmdebstrap >&2 \
      || die "apt-get install mmdebstrap failed (see above)"
  fi
fi
[[ -d /usr/share/mmdebstrap/hooks/merged-usr ]] \
  || die "this mmdebstrap has no merged-usr hook (/usr/share/mmdebstrap/hooks/merged-usr): mmdebstrap >= 1.0 is needed"

# A foreign platform: its binaries run through qemu-user, registered in binfmt_misc with the
# F (fix-binary) flag, so the kernel holds the interpreter open and the chroots need none.
emulator=$(build --emulator "$@")
if [[ -n $emulator ]]; then
  if ! command -v update-binfmts >/dev/null 2>&1 || ! command -v arch-test >/dev/null 2>&1 \
    || [[ ! -f /usr/share/binfmts/$emulator ]]; then
    command -v apt-get >/dev/null 2>&1 \
      || die "building for another architecture needs qemu-user-static, binfmt-support and arch-test (Debian packages) and this host has no apt-get: install them, register $emulator with the F flag, and run again"
    log "installing qemu-user-static, binfmt-support and arch-test (Debian packages): they run the foreign architecture's binaries, and mmdebstrap checks that they do"
    export DEBIAN_FRONTEND=noninteractive
    pkgs=(qemu-user-static binfmt-support arch-test)
    if ! apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2; then
      apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2 \
        || die "apt-get install ${pkgs[*]} failed (see above)"
    fi
  fi
  if [[ ! -f /proc/sys/fs/binfmt_misc/register ]]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
      || die "cannot mount binfmt_misc at /proc/sys/fs/binfmt_misc (a container needs it from its host)"
  fi
  # qemu-user-static's entry says fix_binary yes: that is the F flag.
  grep -q '^fix_binary yes' "/usr/share/binfmts/$emulator" \
    || die "/usr/share/binfmts/$emulator does not set fix_binary: this qemu-user-static cannot run inside chroots"
  if [[ ! -f /proc/sys/fs/binfmt_misc/$emulator ]]; then
    update-binfmts --import "$emulator" >&2 || die "update-binfmts --import $emulator failed"
  fi
  update-binfmts --enable "$emulator" >&2 2>/dev/null || true
  grep -qx enabled "/proc/sys/fs/binfmt_misc/$emulator" \
    || die "binfmt_misc entry $emulator is not enabled (update-binfmts --enable $emulator)"
fi

# One build at a time per cache: a second waits and then finds the first one's archive.
cache=$("$python" -c 'from image.build import cache_dir; print(cache_dir())')
mkdir -p "$cache"
exec 9>"$cache/.lock"
if ! flock -n 9; then
  log "waiting for another build of the image (lock $cache/.lock)"
  flock 9
fi
build "$@"
