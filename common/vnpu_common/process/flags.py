"""What both commands share on their command line: one flag per setting,
read over the `VNPU_*` environment, with `--help` and `--version`.

pydantic-settings' own CLI source builds the flags from the settings model, so
a setting's flag, help text, choices, default and environment variable all
come from its one field definition. A field annotated `CliSuppress[...]` is a
developer flag: accepted, but absent from `--help`.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, CliSettingsSource
from pydantic_settings.exceptions import SettingsError

from vnpu_common import __version__

S = TypeVar("S", bound=BaseSettings)

EPILOG = (
    "Every flag can also be set by the environment variable shown with it; "
    "a flag wins over its variable."
)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, without breaking lines at hyphens: a flag or a default
    such as `vnpu-system` stays whole, and so can be copied."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )


def _add_argument(parser: argparse.ArgumentParser, *names: str, **kwargs: Any) -> argparse.Action:
    # pydantic-settings prints an empty default as nothing at all.
    if isinstance(kwargs.get("help"), str):
        kwargs["help"] = kwargs["help"].replace("(default: )", '(default: "")')
    return parser.add_argument(*names, **kwargs)


def flag_name(field: str) -> str:
    """The flag of a setting: `--foo-bar` for `foo_bar`."""
    return "--" + field.replace("_", "-")


def parse_settings(
    model: type[S],
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
) -> S:
    """Settings from `argv` (default: sys.argv) over the environment over the
    defaults. `--help` and `--version` print and exit 0; a bad value or an
    unknown flag exits 2 with a message naming the flag and its variable."""
    parser = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [--help] [--version] [--FLAG VALUE ...]",
        description=description,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
        # `--kube` silently meaning --kubeconfig is a trap, and one that
        # grows: a new flag can make yesterday's abbreviation ambiguous.
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{prog} {__version__}")
    source: CliSettingsSource[argparse.ArgumentParser] = CliSettingsSource(
        model,
        root_parser=parser,
        cli_kebab_case=True,
        cli_avoid_json=True,
        cli_hide_none_type=True,
        cli_show_env_vars=True,
        cli_implicit_flags=False,
        add_argument_method=_add_argument,
        formatter_class=HelpFormatter,
    )
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        # pydantic-settings' constructor takes the source under a private
        # keyword its stubs do not declare.
        settings_kwargs: dict[str, Any] = {"_cli_settings_source": source(args=args)}
        return model(**settings_kwargs)
    except ValidationError as exc:
        parser.error("; ".join(describe(e, source.env_var_names) for e in exc.errors()))
    except SettingsError as exc:
        # An environment variable pydantic-settings could not even decode.
        parser.error(str(exc))


def describe(error: ErrorDetails, env_vars: Mapping[str, Sequence[str]]) -> str:
    """One validation error, naming the flag and the environment variable it
    may have come from (the message cannot know which of the two it was)."""
    message = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:  # a rule across settings; its message names them
        return message
    field = str(error["loc"][0])
    names = [flag_name(field), *env_vars.get(field, ())]
    where = f"{names[0]} ({', '.join(names[1:])})" if len(names) > 1 else names[0]
    given = repr(error.get("input"))
    if isinstance(error.get("input"), str) and given not in message:
        message += f" (got {given})"
    return f"{where}: {message}"
