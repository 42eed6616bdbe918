"""What both commands share: settings from flags over `VNPU_*` environment
variables, and logging."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def parse_settings(
    model: type[S],
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    list_fields: Sequence[str] = (),
) -> S:
    """One flag per setting (`--foo-bar` for `foo_bar`); flags win over the
    environment. Bad values exit with pydantic's message naming the setting.
    `list_fields` take comma-separated flag values."""
    parser = argparse.ArgumentParser(prog=prog, description=description, argument_default=None)
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, default=None, help=field.description)
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    for name in list_fields:
        if isinstance(overrides.get(name), str):
            overrides[name] = [n.strip() for n in overrides[name].split(",") if n.strip()]
    try:
        return model(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        parser.error(problems)


def configure_logging(level: str) -> None:
    """Plain text on stderr; Kopf logs every handler call at INFO and the
    client every response body at DEBUG, which at hundreds of pods a second
    drowns what matters."""
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("kopf").setLevel(logging.WARNING)
    logging.getLogger("kubernetes_asyncio").setLevel(logging.INFO)
