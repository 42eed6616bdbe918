#!/usr/bin/env bash
# Builds, here, what bench/device_run.sh needs on a lent 16-core machine with
# no network (/work/shared/docs/BIG-MACHINE.md): the plane's binaries
# xz-compressed, the locked Python wheels for Python 3.12 on x86_64, the
# protection policies rendered (the machine has no helm to render them) and
# the agent's generated gRPC modules (ignored by git, so not in the checkout
# there). Everything goes under .device/ (ignored through .git/info/exclude,
# not .gitignore), split into parts .device/part1, part2, ... of at most
# PART_MB MB each: one part per call's `carry`, under the 64 MiB a call carries.
#
#   bash bench/device_prepare.sh          # about 10 minutes of xz on 2 cores
#
# Then, on the device, back to back (the machine keeps files outside the
# checkout only while it stays warm):
#   carry [".device/part1"]:  bash bench/device_run.sh unpack
#   carry [".device/part2"]:  bash bench/device_run.sh unpack main    (or: unpack scale)
# (with more parts, one `unpack` call per part before the last).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-.venv/bin/python}
PART_MB=${PART_MB:-60}
OUT=.device
STAGE=$OUT/stage

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$OUT/" "$exclude" 2>/dev/null || echo "/$OUT/" >>"$exclude"

bin_dir=$(bash hack/plane/build.sh --print | tail -1)
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm; do
    [[ -x $bin_dir/$b ]] || { echo "missing $bin_dir/$b: run make plane first" >&2; exit 1; }
done

rm -rf "$OUT"/part*
mkdir -p "$STAGE/bin" "$STAGE/wheels"

# 1. Binaries: xz -9e, about 5:1 (the slow part; kept between runs of this
# script while the binary is unchanged).
for b in kube-apiserver kube-controller-manager kube-scheduler etcd kubectl kwok; do
    if [[ ! -s $STAGE/bin/$b.xz || $bin_dir/$b -nt $STAGE/bin/$b.xz ]]; then
        echo "xz $b ($(du -m "$bin_dir/$b" | cut -f1) MB)" >&2
        xz -9e -T1 -c "$bin_dir/$b" >"$STAGE/bin/$b.xz.tmp"
        mv "$STAGE/bin/$b.xz.tmp" "$STAGE/bin/$b.xz"
    fi
done

# 2. The wheels of pylock.toml for CPython 3.12 on manylinux x86_64 (binary only).
"$PY" - "$STAGE/wheels.txt" <<'EOF'
import sys, tomllib
lock = tomllib.load(open("pylock.toml", "rb"))
with open(sys.argv[1], "w") as f:
    for p in lock["packages"]:
        f.write(f"{p['name']}=={p['version']}\n")
EOF
"$PY" -m pip download -q --dest "$STAGE/wheels" --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any \
    -r "$STAGE/wheels.txt"

# 3. The protection policies as the plane renders them, for a `helm` that prints them.
PYTHONPATH=$("$PY" hack/localplane/sourceroots.py) "$PY" - "$bin_dir/helm" "$STAGE/policies.yaml" <<'EOF'
import sys, tempfile
from pathlib import Path
from localplane import policies
from localplane.plane import default_lane, lane_version
with tempfile.TemporaryDirectory() as home:
    text = policies.render(sys.argv[1], Path(home), lane_version(default_lane()))
Path(sys.argv[2]).write_text(text)
EOF

# 4. The agent's generated gRPC modules (make venv generates them; git ignores them).
git ls-files --others --ignored --exclude-standard -- node_agent/vnpu_agent/dra/protos \
    | grep -E '_pb2(_grpc)?\.pyi?$' >"$STAGE/protos.txt"
[[ -s $STAGE/protos.txt ]] || { echo "no generated protos: run make venv" >&2; exit 1; }
tar -cf "$STAGE/protos.tar" -T "$STAGE/protos.txt"
basename "$bin_dir" >"$STAGE/bin-dir-name"

# 5. As few parts of at most PART_MB MiB as hold it all, filled evenly.
"$PY" - "$STAGE" "$OUT" "$PART_MB" <<'EOF'
import os, shutil, sys
from pathlib import Path
stage, out, limit = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) * 1024 * 1024
files = [p for p in stage.rglob("*") if p.is_file() and p.name != "wheels.txt"
         and p.name != "protos.txt" and not p.name.endswith(".tmp")]
total = sum(f.stat().st_size for f in files)
count = -(-total // limit)  # as few parts as fit, then filled evenly (largest first)
parts: list[list[Path]] = [[] for _ in range(count)]
sizes = [0] * count
for f in sorted(files, key=lambda p: -p.stat().st_size):
    n = f.stat().st_size
    i = min(range(count), key=sizes.__getitem__)
    if sizes[i] + n > limit:
        sys.exit(f"{f} does not fit in {count} parts of {limit} bytes: raise PART_MB")
    parts[i].append(f); sizes[i] += n
for i, group in enumerate(parts, 1):
    for f in group:
        dest = out / f"part{i}" / f.relative_to(stage)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(f, dest) if not dest.exists() else None
    print(f"{out}/part{i}: {sizes[i-1] / 1e6:.1f} MB, {len(group)} files")
EOF
echo "carry one part per call, in order; the last call runs: bash bench/device_run.sh unpack main|scale"
