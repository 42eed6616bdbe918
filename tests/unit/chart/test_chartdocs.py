"""The chart's README is generated from its values and schema, and says so when stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from chartdocs import UndocumentedValueError, render, top_level_comments
from chartdocs.__main__ import main

CHART = Path(__file__).resolve().parents[3] / "charts" / "vnpu-operator"


def test_the_checked_in_readme_is_what_the_chart_makes() -> None:
    assert (CHART / "README.md").read_text() == render(CHART), "run `make chart-docs`"


@pytest.fixture
def chart(tmp_path: Path) -> Path:
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    return copy


def _schema_edit(chart: Path, path: list[str], key: str, value: object) -> None:
    file = chart / "values.schema.json"
    schema = json.loads(file.read_text())
    node = schema
    for part in path:
        node = node["properties"][part]
    if value is None:
        del node[key]
    else:
        node[key] = value
    file.write_text(json.dumps(schema, indent=2) + "\n")


def test_check_fails_on_a_stale_readme_and_passes_once_regenerated(
    chart: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--check", str(chart)]) == 0
    _schema_edit(chart, ["agent", "driver"], "description", "Which driver, said differently.")
    assert main(["--check", str(chart)]) == 1
    assert "README.md is stale; run `make chart-docs`" in capsys.readouterr().err
    assert main([str(chart)]) == 0
    assert "Which driver, said differently." in (chart / "README.md").read_text()
    assert main(["--check", str(chart)]) == 0


def test_every_value_has_a_row_with_its_default(chart: Path) -> None:
    text = render(chart)
    assert "| `agent.updateStrategy.rollingUpdate.maxUnavailable` | integer or string | " in text
    assert '`"10%"`' in text
    assert '| `image.digest` | string | `""` |' in text
    # Enums are listed, and a value's text is escaped for the table.
    assert 'One of: `"dcmi"`, `"npu-smi"`, `"sim"`.' in text
    assert "&lt;release&gt;-agent" in text


def test_a_value_without_a_description_is_an_error(
    chart: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _schema_edit(chart, ["agent", "hostPaths", "cdi"], "description", None)
    with pytest.raises(UndocumentedValueError, match=r"agent\.hostPaths\.cdi has no description"):
        render(chart)
    assert main(["--check", str(chart)]) == 1
    assert "agent.hostPaths.cdi has no description" in capsys.readouterr().err


def test_a_value_the_schema_lacks_is_an_error(chart: Path) -> None:
    values = chart / "values.yaml"
    values.write_text(values.read_text() + "\nsurprise:\n  key: 1\n")
    with pytest.raises(UndocumentedValueError, match="surprise"):
        render(chart)


def test_section_introductions_are_the_comments_above_top_level_keys() -> None:
    comments = top_level_comments(
        "# Not this one: a blank line follows.\n\n# The image.\n# Two lines.\nimage:\n"
        "  # inner comment\n  tag: x\nplain: 1\n"
    )
    assert comments == {"image": "The image. Two lines."}
