"""Checksums and cosign signatures of a release's files, and their check.

Each file gets a cosign bundle `<file>.sigstore.json` (`cosign sign-blob --key`), made
offline: no transparency log, no Fulcio certificate, only the key the release names. The
key's public half is `cosign.pub` in the release; its fingerprint (SHA-256 of the DER
SubjectPublicKeyInfo, what `openssl pkey -pubin -outform DER | sha256sum` prints) is in
release.json and must match the one the project publishes (docs/RELEASING.md).

The key: RELEASE_SIGNING_KEY names a cosign private key file or a KMS URI
(`awskms://...`, `gcpkms://...`, `hashivault://...`, `azurekms://...`) and
RELEASE_KEY_NAME what the release calls it; COSIGN_PASSWORD is the key file's password, as
cosign reads it. Without RELEASE_SIGNING_KEY a throwaway key is generated once into the
cache (~/.cache/vnpu-operator/release/throwaway-key/), for local and CI runs.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization

ROOT = Path(__file__).resolve().parents[2]
TOOLS_SCRIPT = ROOT / "hack" / "tools" / "build.sh"
SUMS = "SHA256SUMS"
PUBLIC_KEY = "cosign.pub"
BUNDLE_SUFFIX = ".sigstore.json"


class SignError(Exception):
    pass


def cache_root() -> Path:
    base = os.environ.get("VNPU_CACHE") or str(Path.home() / ".cache" / "vnpu-operator")
    return Path(base) / "release"


def cosign_binary() -> Path:
    """The pinned cosign (hack/tools/versions.env), built from its module if missing."""
    proc = subprocess.run(["bash", str(TOOLS_SCRIPT), "cosign"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SignError(f"hack/tools/build.sh cosign failed:\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Key:
    ref: str  # what `cosign --key` takes: a file or a KMS URI
    name: str
    throwaway: bool


def release_key(cosign: Path) -> Key:
    """The key named by RELEASE_SIGNING_KEY, or the cache's throwaway key (made once)."""
    ref = os.environ.get("RELEASE_SIGNING_KEY", "").strip()
    if ref:
        if "://" not in ref and not Path(ref).is_file():
            raise SignError(f"RELEASE_SIGNING_KEY={ref}: no such key file")
        name = os.environ.get("RELEASE_KEY_NAME", "").strip()
        if not name:
            raise SignError("RELEASE_SIGNING_KEY is set: name the key in RELEASE_KEY_NAME too")
        return Key(ref, name, throwaway=False)
    where = cache_root() / "throwaway-key"
    key = where / "cosign.key"
    if not key.is_file():
        where.mkdir(parents=True, exist_ok=True)
        # An empty password: the key never leaves this cache and signs nothing published.
        _cosign(cosign, ["generate-key-pair"], cwd=where, env={"COSIGN_PASSWORD": ""})
    return Key(str(key), f"throwaway key of {socket.gethostname()}", throwaway=True)


def _cosign(
    cosign: Path, args: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> str:
    full_env = {**os.environ, **(env or {})}
    if "RELEASE_SIGNING_KEY" not in os.environ:
        full_env.setdefault("COSIGN_PASSWORD", "")
    proc = subprocess.run(
        [str(cosign), *args], capture_output=True, text=True, cwd=cwd, env=full_env
    )
    if proc.returncode != 0:
        raise SignError(f"cosign {args[0]} failed (exit {proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def write_public_key(cosign: Path, key: Key, out: Path) -> str:
    """Writes the key's public half to `out`; returns its fingerprint."""
    _cosign(cosign, ["public-key", "--key", key.ref, "--outfile", str(out)])
    return fingerprint(out.read_bytes())


def fingerprint(pem: bytes) -> str:
    """SHA-256 of the public key's DER SubjectPublicKeyInfo, as hex."""
    public = serialization.load_pem_public_key(pem)
    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_sums(directory: Path, names: list[str]) -> Path:
    """SHA256SUMS in `sha256sum`'s format (`sha256sum -c` reads it)."""
    out = directory / SUMS
    out.write_text("".join(f"{sha256_file(directory / n)}  {n}\n" for n in sorted(names)))
    return out


def sign(cosign: Path, key: Key, path: Path) -> Path:
    """A cosign bundle of `path`, offline (no transparency log, no certificate)."""
    bundle = path.with_name(path.name + BUNDLE_SUFFIX)
    _cosign(
        cosign,
        [
            "sign-blob",
            "--yes",
            "--key",
            key.ref,
            "--bundle",
            str(bundle),
            "--use-signing-config=false",
            "--tlog-upload=false",
            str(path),
        ],
    )
    return bundle


def verify(cosign: Path, directory: Path, public_key: Path | None = None) -> list[str]:
    """What `docs/RELEASING.md`'s verify command checks, from Python: every file of
    SHA256SUMS has its sum, and it and SHA256SUMS have a good signature by the key.
    Returns the files checked; raises SignError on the first that fails."""
    pub = public_key or directory / PUBLIC_KEY
    sums = directory / SUMS
    names = []
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if sha256_file(directory / name) != digest:
            raise SignError(f"{name}: its SHA-256 is not the one in {SUMS}")
        names.append(name)
    for name in [SUMS, *names]:
        path = directory / name
        bundle = path.with_name(path.name + BUNDLE_SUFFIX)
        _cosign(
            cosign,
            [
                "verify-blob",
                "--key",
                str(pub),
                "--bundle",
                str(bundle),
                "--insecure-ignore-tlog=true",
                str(path),
            ],
        )
    return names
