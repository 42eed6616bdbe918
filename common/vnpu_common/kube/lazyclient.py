"""kubernetes-asyncio with its API classes and models loaded on first use.

`import kubernetes_asyncio` (Kopf does it too) imports every API class and
every model the generator wrote: 138 API modules and 768 model modules, over
60 MB of each process's memory (a bare interpreter is 11 MB, 74 MB after the
import), more than the operator's caches for 1000 nodes. The components use
four API classes and a handful of models.

`install()` puts in place of the three generated package modules
(`client`, `client.api`, `client.models`) modules that import a name's own
module the first time the name is read; every class is kubernetes-asyncio's
own, only when it is loaded changes. Which module defines which name is read
from the packages' own `__init__.py` (their `from ... import Name` lines), so
a release that adds names keeps working, and one laid out otherwise (no such
lines) is simply imported as it is. It must run before anything imports
`kubernetes_asyncio` or Kopf: both components' package `__init__` call it.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = "kubernetes_asyncio"
PACKAGES = (f"{ROOT}.client", f"{ROOT}.client.api", f"{ROOT}.client.models")
_IMPORT = re.compile(r"^from (kubernetes_asyncio\.client[\w.]*) import (\w+)\s*$", re.MULTILINE)
_VERSION = re.compile(r'^__version__ = "([^"]+)"\s*$', re.MULTILINE)


class LazyPackage(ModuleType):
    """A package whose names are imported from their modules when first read."""

    def __init__(self, name: str, init: Path, where: dict[str, str]) -> None:
        super().__init__(name)
        self.__file__ = str(init)
        self.__path__ = [str(init.parent)]
        self.__package__ = name
        self.__spec__ = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=self.__path__
        )
        self.__all__ = sorted(where)
        self._where = where

    def __getattr__(self, attr: str) -> Any:
        missing = AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        module = self._where.get(attr)
        if module is not None:
            value = getattr(importlib.import_module(module), attr)
        elif attr.startswith("__"):
            raise missing
        else:
            # A submodule (`rest`, `api_client`) read as an attribute.
            try:
                value = importlib.import_module(f"{self.__name__}.{attr}")
            except ModuleNotFoundError:
                raise missing from None
        setattr(self, attr, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._where})


def _package(name: str, root: Path) -> LazyPackage | None:
    init = root.joinpath(*name.split(".")[1:], "__init__.py")
    try:
        source = init.read_text(encoding="utf-8")
    except OSError:
        return None
    where = {m[2]: m[1] for m in _IMPORT.finditer(source)}
    if not where:
        return None
    package = LazyPackage(name, init, where)
    if version := _VERSION.search(source):
        package.__version__ = version[1]  # type: ignore[attr-defined]
    return package


def install() -> bool:
    """Makes kubernetes-asyncio's generated packages lazy; False (nothing
    changed) if it is imported already or not laid out as expected."""
    if any(name == ROOT or name.startswith(f"{ROOT}.") for name in sys.modules):
        return False
    spec = importlib.util.find_spec(ROOT)
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    packages = {name: _package(name, root) for name in PACKAGES}
    ready = {name: p for name, p in packages.items() if p is not None}
    if len(ready) != len(PACKAGES):
        return False
    sys.modules.update(ready)
    client = ready[f"{ROOT}.client"]
    client.api = ready[f"{ROOT}.client.api"]  # type: ignore[attr-defined]
    client.models = ready[f"{ROOT}.client.models"]  # type: ignore[attr-defined]
    return True


def is_lazy() -> bool:
    """Whether this process runs with the lazy packages."""
    return isinstance(sys.modules.get(f"{ROOT}.client"), LazyPackage)
