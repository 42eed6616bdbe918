"""Logging of both components: one handler on stderr for every logger,
Kopf's included, as text lines (the default) or one JSON object per line
for a log collector."""

from __future__ import annotations

import logging
import re
import sys
from typing import Literal, TextIO

from pythonjsonlogger.json import JsonFormatter

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

# The keys a JSON line always has (exception only with a traceback), named as
# log collectors commonly expect them rather than as LogRecord attributes.
JSON_KEYS = {"levelname": "level", "name": "logger", "exc_info": "exception"}


# Kopf's API client logs every retried request at ERROR. Its last try
# ("...; escalating: ...") stays ERROR: that one gives up.
_KOPF_RETRY = re.compile(r"Request attempt #?\S+ failed; will retry: ")


class KopfRetries(logging.Filter):
    """Lowers Kopf's "Request attempt #2/10 failed; will retry: ..." to
    WARNING: a retried request with no answer is the fault our own retries
    log at WARNING (vnpu_common.kube.faults), not a crash."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno == logging.ERROR
            and record.name.startswith("kopf")
            and _KOPF_RETRY.match(record.getMessage())
        ):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def json_formatter() -> logging.Formatter:
    """time (ISO 8601, UTC), level, logger, message, exception; any `extra`
    (Kopf's object reference, say) as further keys."""
    return JsonFormatter(
        "{levelname}{name}{message}", style="{", rename_fields=JSON_KEYS, timestamp="time"
    )


def configure_logging(
    level: LogLevel | str, fmt: LogFormat = "text", *, stream: TextIO | None = None
) -> None:
    """Replaces the root logger's handlers with one on `stream` (stderr).
    Kopf logs every handler call at INFO and the client every response body
    at DEBUG, which at hundreds of pods a second drowns what matters."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(json_formatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(KopfRetries())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("kopf").setLevel(logging.WARNING)
    logging.getLogger("kubernetes_asyncio").setLevel(logging.INFO)
