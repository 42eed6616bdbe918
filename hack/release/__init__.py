"""The release: versioned artifacts from a clean tree (`make release`; docs/RELEASING.md)."""
