# Shared by hack/plane/build.sh and hack/node/build.sh: logging, the "is it
# built yet" check and a Go build that shows progress. The sourcing script sets
# TAG (the log prefix) and bin_dir (its cache directory) first.

log() { printf '[%s] %s\n' "$TAG" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$TAG" "$*" >&2; exit 1; }

# True (0) when any of the named binaries is missing from bin_dir.
need() { for b in "$@"; do [[ -x "$bin_dir/$b" ]] || return 0; done; return 1; }

# Prints a line every N packages so a cold build (minutes) shows life.
progress() {
  local what=$1
  awk -v what="$what" -v tag="$TAG" '
    { n++; if (n % 250 == 0) { printf "[%s]   %s: %d packages compiled\n", tag, what, n > "/dev/stderr"; fflush("/dev/stderr") } }
    END { printf "[%s]   %s: %d packages compiled\n", tag, what, n > "/dev/stderr" }'
}

# Runs a build command, feeding its -v package list to progress(); keeps the
# real error output and fails with it.
run_build() {
  local what=$1; shift
  local errlog
  errlog=$(mktemp)
  if ! "$@" 2> >(tee "$errlog" | grep -vE '^(#|go: downloading)' | grep -E '^[a-z0-9._/-]+$' | progress "$what") ; then
    sleep 1
    grep -vE '^[a-z0-9._/-]+$' "$errlog" >&2 || true
    rm -f "$errlog"
    die "building $what failed (see above)"
  fi
  sleep 1
  rm -f "$errlog"
}
