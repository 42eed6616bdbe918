"""The one error the plugin reports to its user: a sentence and exit 1."""

from __future__ import annotations


class CliError(Exception):
    """Something the user can act on (no cluster, no such pod, a pod that
    does not ask for vNPUs); printed as `error: <message>`."""
