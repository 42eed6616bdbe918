"""The release: versioned artifacts from a clean tree (`make release`; docs/RELEASING.md).

- `build`: `make release`: the chart, the image archives, SBOMs, checksums and
  signatures under `dist/<version>/`.
- `oci`: the release's image archives from the builder's, nothing rebuilt, so
  the digests are the builder's.
- `sign`: checksums and offline cosign signatures, and their check.
- `version`: the one version, and the files that must repeat it (`--check`, `--set`).
"""
