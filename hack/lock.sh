#!/usr/bin/env bash
# Writes the lock files (`make lock`) from pyproject.toml, whose ranges stay floors:
#
#   pylock.dev.toml          the tested set: the project's dependencies and its dev tools;
#                            `make venv` (so `make test` and CI) installs exactly this
#   pylock.toml              the image's set: the same versions, without the dev tools;
#                            the Dockerfile installs exactly this
#   build-requirements.txt   what installs the two: a pip that reads pylock.toml (PEP 751)
#                            and the build backend of [build-system], with grpcio-tools,
#                            which generates the DRA plugin's stubs in the build; in
#                            requirements.txt form, which the pip Debian ships can read
#
# Every file pins every package with the sha256 of each of its files on PyPI, for every
# platform and Python >= 3.11 (uv's universal resolution): the same lock serves amd64 and
# arm64 hosts. uv keeps each existing pin unless pyproject.toml no longer allows it.
#
#   hack/lock.sh             add or drop what pyproject.toml changed, keep every other pin
#   hack/lock.sh --upgrade   move every pin to the newest version the floors allow
set -euo pipefail
cd "$(dirname "$0")/.."

uv=${UV:-.venv/bin/uv}
python=${PY:-.venv/bin/python}
# The first pip whose `install -r` reads pylock.toml files that this was tried with.
pip_floor="pip>=26.3"

flags=(--universal --python-version 3.11 --quiet --custom-compile-command "make lock")
case "${1:-}" in
  --upgrade) flags+=(--upgrade) ;;
  "") ;;
  *) echo "usage: hack/lock.sh [--upgrade]" >&2; exit 2 ;;
esac
[[ -x "$uv" ]] || { echo "hack/lock.sh: $uv is missing: run 'make venv' first" >&2; exit 1; }

"$uv" pip compile "${flags[@]}" --extra dev -o pylock.dev.toml pyproject.toml

# The image's set is resolved within the tested set's pins, so it can hold no version
# that the tests did not run with.
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
"$python" - pylock.dev.toml >"$pins" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    for package in tomllib.load(f)["packages"]:
        print(f"{package['name']}=={package['version']}")
EOF
"$uv" pip compile "${flags[@]}" --constraints "$pins" -o pylock.toml pyproject.toml

# The build's tools: pip, the build backend, and grpcio-tools, which generates the DRA
# plugin's stubs before the wheel is built (the Dockerfile; `make venv` too). Resolved
# within the tested set's pins, so the venv that installs both files gets one version of each.
dev_pins=$(mktemp)
trap 'rm -f "$pins" "$dev_pins"' EXIT
"$python" - pylock.dev.toml >"$dev_pins" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    for package in tomllib.load(f)["packages"]:
        print(f"{package['name']}=={package['version']}")
EOF
"$python" - >"$pins" <<EOF
import tomllib
print("$pip_floor")
print("grpcio-tools")
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
EOF
"$uv" pip compile "${flags[@]}" --constraints "$dev_pins" --generate-hashes --no-annotate \
  -o build-requirements.txt "$pins"
echo "wrote pylock.dev.toml, pylock.toml, build-requirements.txt" >&2
