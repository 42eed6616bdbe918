#!/usr/bin/env bash
# The benchmark on a lent 16-core machine with no network
# (/work/shared/docs/BIG-MACHINE.md), from what bench/device_prepare.sh built
# here. Modes, in the order given:
#
#   unpack  the parts of .device/ this call carries: binaries decompressed into
#           $DEV/plane/<bin dir>, wheels, policies and gRPC modules kept in $DEV
#           (outside the checkout: there while the machine stays warm)
#   main    200 nodes, 1200 pods at 20/s with the floors (cores 0-7) beside 1000
#           nodes, 4 agents, 1000 pods at 20/s with the floor replay (cores 8-15)
#   scale   python -m bench.scale at 250 and 2000 nodes (cores 0-7) beside 500
#           and 1000 (cores 8-15), 300 pods at 5/s each; merged into one file
#   release 1000 nodes alone (cores 8-15), 300 churn pods, no replays: the
#           fill's release with the API server profiled, the profiles in $OUT
#
# e.g. carry [".device/part1"]: bash bench/device_run.sh unpack
#      carry [".device/part2"]: bash bench/device_run.sh unpack main
# Results, logs and a note of the machine go to $OUT (tee'd as they come, so a
# command cut off still returns what it had). Each run is cut at LIMIT seconds
# (default 540: under the 10 minutes a command may take). Knobs (environment):
# CORES_A, CORES_B (0-7, 8-15), NODES_A, NODES_B, PODS_200, PODS_1000 (main's
# sizes: 200 and 1000 nodes, 1200 and 1000 pods), SCALE_A, SCALE_B (the node
# counts of each half), SCALE_ARGS (more options of bench.scale), VNPU_DEVICE_VENV
# (an existing venv: no wheels installed), VNPU_DEVICE_HOME ($HOME/vnpu-device),
# MAIN_ARGS (more options of both main runs, e.g. --no-floors to keep only the
# floor replay when a call's time is short).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
DEV=${VNPU_DEVICE_HOME:-$HOME/vnpu-device}
OUT=${OUT:-/tmp/vnpu-device-out}
LIMIT=${LIMIT:-540}
CORES_A=${CORES_A:-0-7}
CORES_B=${CORES_B:-8-15}
mkdir -p "$DEV" "$OUT"
log() { echo "[device_run $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/device_run.log" >&2; }

unpack() {
    local part found=0
    for part in .device/part*; do
        [[ -d $part ]] || continue
        found=1
        log "unpacking $part ($(du -sm "$part" | cut -f1) MB)"
        [[ -f $part/bin-dir-name ]] && cp "$part/bin-dir-name" "$DEV/"
        [[ -f $part/policies.yaml ]] && cp "$part/policies.yaml" "$DEV/"
        [[ -f $part/protos.tar ]] && cp "$part/protos.tar" "$DEV/"
        if [[ -d $part/wheels ]]; then
            mkdir -p "$DEV/wheels" && cp "$part"/wheels/*.whl "$DEV/wheels/"
        fi
        if [[ -d $part/bin ]]; then
            mkdir -p "$DEV/xz" && cp "$part"/bin/*.xz "$DEV/xz/"
        fi
    done
    (( found )) || log "no .device/part* carried in this call"
    if [[ -f $DEV/bin-dir-name ]] && compgen -G "$DEV/xz/*.xz" >/dev/null; then
        local bins
        bins="$DEV/plane/$(cat "$DEV/bin-dir-name")"
        mkdir -p "$bins"
        python3 - "$DEV/xz" "$bins" <<'EOF'
import lzma, os, shutil, sys
from pathlib import Path
src, dest = Path(sys.argv[1]), Path(sys.argv[2])
for xz in sorted(src.glob("*.xz")):
    out = dest / xz.name[:-3]
    with lzma.open(xz) as f, open(f"{out}.tmp", "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
    os.chmod(f"{out}.tmp", 0o755)
    os.replace(f"{out}.tmp", out)
    xz.unlink()
    print(f"  {out.name}: {out.stat().st_size // 1000000} MB", file=sys.stderr)
EOF
    fi
}

setup() {
    local bins
    [[ -f $DEV/bin-dir-name ]] || { log "no payload unpacked in $DEV: run 'unpack' first"; exit 2; }
    bins="$DEV/plane/$(cat "$DEV/bin-dir-name")"
    if [[ ! -x $bins/helm ]]; then
        # The plane renders the protection policies with `helm template`
        # (PATH set to helm's own folder): print the ones rendered beforehand.
        printf '#!/bin/sh\n[ "$1" = template ] && exec /bin/cat %q\nexit 1\n' \
            "$DEV/policies.yaml" >"$bins/helm"
        chmod +x "$bins/helm"
    fi
    local b
    for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm; do
        [[ -x $bins/$b ]] || { log "missing $bins/$b: carry and unpack every part"; exit 2; }
    done
    tar -xf "$DEV/protos.tar" -C "$ROOT"
    VENV=${VNPU_DEVICE_VENV:-$DEV/venv}
    if [[ ! -x $VENV/bin/python ]]; then
        log "venv from $(ls "$DEV"/wheels | wc -l) wheels"
        /usr/bin/python3.12 -m venv --without-pip "$DEV/venv"
        if ! python3 -m pip --python "$DEV/venv/bin/python" install -q --no-index \
            --find-links "$DEV/wheels" "$DEV"/wheels/*.whl; then
            log "pip failed; unzipping the wheels into the venv"
            "$DEV/venv/bin/python" - "$DEV/wheels" <<'EOF'
import sys, sysconfig, zipfile
from pathlib import Path
site = Path(sysconfig.get_paths()["purelib"])
for whl in Path(sys.argv[1]).glob("*.whl"):
    zipfile.ZipFile(whl).extractall(site)
EOF
        fi
    fi
    export VNPU_PLANE_CACHE=$DEV/plane
    export PYTHONPATH=$ROOT/common:$ROOT/operator:$ROOT/node_agent:$ROOT/hack:$ROOT
    PY=$VENV/bin/python
    {
        echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo '?') (working tree may differ)"
        echo "nproc: $(nproc)"; grep -m1 'model name' /proc/cpuinfo; free -g | head -2
        "$PY" --version
    } >"$OUT/machine.txt" 2>&1
}

# run NAME CORES ARGS...: one pinned benchmark, its output tee'd to $OUT/NAME.log.
pinned() {
    local name=$1 cores=$2
    shift 2
    log "$name on cores $cores: $*"
    timeout "$LIMIT" taskset -c "$cores" "$PY" "$@" 2>&1 | tee "$OUT/$name.log" >/dev/null
    log "$name: exit ${PIPESTATUS[0]}"
}

# The printed results of each log (what follows its '===' heading).
show() {
    local f
    for f in "$@"; do
        [[ -f $f ]] && { echo "##### $(basename "$f")"; sed -n '/^=== /,$p' "$f"; }
    done
}

main_runs() {
    setup
    # shellcheck disable=SC2086 # MAIN_ARGS: several options
    pinned results-200 "$CORES_A" -m bench --nodes "${NODES_A:-200}" --pods "${PODS_200:-1200}" --rate 20 \
        --idle 30 --kopf-floor-pods 300 --out "$OUT/results-200.json" \
        --timeline-out "$OUT/timeline-200.json" ${MAIN_ARGS:-} &
    # shellcheck disable=SC2086
    pinned results-1000 "$CORES_B" -m bench --nodes "${NODES_B:-1000}" --agents 4 --pods "${PODS_1000:-1000}" \
        --rate 20 --idle 30 --no-floors --timeout 300 --out "$OUT/results-1000.json" \
        --timeline-out "$OUT/timeline-1000.json" --apiserver-profile --workdir "$DEV/w1000" \
        ${MAIN_ARGS:-} &
    wait
    # No Go there: read them here with python -m bench.apiprofile <kube-apiserver> <files>.
    mkdir -p "$OUT/apiserver-1000"
    cp "$DEV"/w1000/release-apiserver-*.pprof "$OUT/apiserver-1000/" 2>/dev/null || true
    show "$OUT/results-200.log" "$OUT/results-1000.log"
}

release_runs() {
    setup
    # shellcheck disable=SC2086 # MAIN_ARGS: several options
    pinned release-1000 "$CORES_B" -m bench --nodes "${NODES_B:-1000}" --agents 4 \
        --pods "${PODS_1000:-300}" --rate 20 --idle 5 --no-floors --no-floor-replay --timeout 300 \
        --out "$OUT/release-1000.json" --apiserver-profile --workdir "$DEV/r1000" ${MAIN_ARGS:-}
    # Files come back flat and few: the release's API server profiles beside the results.
    cp "$DEV"/r1000/release-apiserver-*.pprof "$OUT/" 2>/dev/null || true
    show "$OUT/release-1000.log"
}

scale_runs() {
    setup
    # shellcheck disable=SC2086 # SCALE_ARGS: several options
    pinned scale-a "$CORES_A" -m bench.scale --nodes "${SCALE_A:-250,2000}" ${SCALE_ARGS:-} \
        --out "$OUT/results-scale-a.json" &
    # shellcheck disable=SC2086
    pinned scale-b "$CORES_B" -m bench.scale --nodes "${SCALE_B:-500,1000}" ${SCALE_ARGS:-} \
        --out "$OUT/results-scale-b.json" &
    wait
    local parts=()
    for f in "$OUT"/results-scale-a.json "$OUT"/results-scale-b.json; do
        [[ -s $f ]] && parts+=("$f")
    done
    if (( ${#parts[@]} )); then
        "$PY" -m bench.scale --merge "${parts[@]}" --out "$OUT/results-scale.json" \
            2>&1 | tee "$OUT/scale.log"
    fi
}

[[ $# -gt 0 ]] || { sed -n '2,25p' "$0"; exit 2; }
for mode in "$@"; do
    case $mode in
        unpack) unpack ;;
        main) main_runs ;;
        scale) scale_runs ;;
        release) release_runs ;;
        *) echo "unknown mode $mode (unpack, main, scale, release)" >&2; exit 2 ;;
    esac
done
