"""Shared builders of admission tests: pods as the API server sends them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from localplane.pods import vnpu_pod
from vnpu_operator.admission import OfferedTemplates

PodFactory = Callable[..., dict[str, Any]]


def _container(spec: str | dict[str, Any]) -> dict[str, Any]:
    return {"name": spec, "image": "busybox"} if isinstance(spec, str) else spec


def build_pod(
    annotations: dict[str, Any] | None = None,
    containers: Sequence[str | dict[str, Any]] = ("app",),
    init_containers: Sequence[str | dict[str, Any]] = (),
    template: str | None = "vir05_1c_16g",
    **spec: Any,
) -> dict[str, Any]:
    """A pod asking for `template` (None: not asking) plus `annotations`;
    containers given as names or as whole container objects (env, image)."""
    pod_spec: dict[str, Any] = {"containers": [_container(c) for c in containers], **spec}
    if init_containers:
        pod_spec["initContainers"] = [_container(c) for c in init_containers]
    return vnpu_pod(
        "train-0", "ml", template=template, annotations=annotations, containers=(), spec=pod_spec
    )


@pytest.fixture
def make_pod() -> PodFactory:
    return build_pod


@pytest.fixture
def offered() -> OfferedTemplates:
    return OfferedTemplates.of_sizes(
        {
            "910B3": {"vir05_1c_16g": (5, 16384), "vir10_3c_32g": (10, 32768)},
            "310P3": {"vir01": (1, 3072), "vir02": (2, 6144), "vir04": (4, 12288)},
        }
    )
