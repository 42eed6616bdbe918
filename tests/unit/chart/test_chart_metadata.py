"""Chart.yaml's Artifact Hub annotations agree with the CRDs, the models and the values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vnpu_common.wire import names
from vnpu_common.wire.models import VNPUAllocation, VNPUNode

ROOT = Path(__file__).resolve().parents[3]
CHART = yaml.safe_load((ROOT / "charts/vnpu-operator/Chart.yaml").read_text())
VALUES = yaml.safe_load((ROOT / "charts/vnpu-operator/values.yaml").read_text())


def annotation(key: str) -> Any:
    return yaml.safe_load(CHART["annotations"][f"artifacthub.io/{key}"])


def test_the_listed_crds_are_the_generated_ones() -> None:
    generated = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
    expected = sorted(
        (c["spec"]["names"]["kind"], v["name"], c["metadata"]["name"])
        for c in generated
        for v in c["spec"]["versions"]
        if v["served"]
    )
    listed = annotation("crds")
    assert sorted((c["kind"], c["version"], c["name"]) for c in listed) == expected
    for crd in listed:
        assert crd["displayName"]
        assert len(crd["description"]) > 20


@pytest.mark.parametrize("model", [VNPUAllocation, VNPUNode])
def test_each_crd_has_an_example_the_models_accept(model: type[Any]) -> None:
    kind = model.model_fields["kind"].default
    (example,) = [e for e in annotation("crdsExamples") if e["kind"] == kind]
    assert example["apiVersion"] == names.API_VERSION
    # The models ignore unknown fields; an example must use none.
    parsed = model.model_validate(example).to_api()
    for key in ("metadata", "spec"):
        for field, value in example[key].items():
            assert parsed[key][field] == value, (kind, key, field)


def test_the_image_is_the_default_image_and_the_metadata_is_complete() -> None:
    (image,) = annotation("images")
    assert image["image"] == f"{VALUES['image']['repository']}:{CHART['appVersion']}"
    assert CHART["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    assert CHART["annotations"]["artifacthub.io/operator"] == "true"
    assert all(link["url"].startswith("https://") for link in annotation("links"))
    assert CHART["sources"]
    assert CHART["maintainers"]
    assert CHART["kubeVersion"]


def test_the_chart_makes_a_device_class_for_every_template_of_the_catalog() -> None:
    """dra.templates is the catalog's template list: a template the agent's catalog
    offers without a DeviceClass would be asked for by vnpu.io/<template> in vain on
    DRA nodes (the webhook sends it there when a DRA node offers it)."""
    from vnpu_agent.drivers import catalog

    offered = {
        t.name for model in catalog.known_models() for t in catalog.find_model(model).templates
    }
    assert set(VALUES["dra"]["templates"]) == offered
    assert all(names.template_of_resource(names.template_resource(t)) == t for t in offered)
