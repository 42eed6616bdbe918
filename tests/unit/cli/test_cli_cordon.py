"""What `kubectl vnpu cordon/uncordon` writes, from plain objects."""

from __future__ import annotations

import jsonpatch
import pytest

from vnpu_cli import cordon
from vnpu_cli.errors import CliError
from vnpu_common.wire.models import CordonedChip


def vnpu_node(*entries: tuple[int, str], version: str = "42") -> dict[str, object]:
    return {
        "metadata": {"name": "n1", "resourceVersion": version},
        "spec": {"cordonedChips": [{"chip": c, "reason": r} for c, r in entries]},
    }


def test_cordon_adds_replaces_and_uncordon_removes() -> None:
    before = cordon.current(vnpu_node((3, "fan")))
    added = cordon.changed(before, 1, "ECC errors")
    assert [(e.chip, e.reason) for e in added] == [(1, "ECC errors"), (3, "fan")]
    replaced = cordon.changed(added, 3, "fan replaced, testing")
    assert [(e.chip, e.reason) for e in replaced] == [
        (1, "ECC errors"),
        (3, "fan replaced, testing"),
    ]
    assert cordon.changed(replaced, 1, None) == [
        CordonedChip(chip=3, reason="fan replaced, testing")
    ]
    assert cordon.changed([], 5, None) == []


def test_a_vnpunode_without_spec_has_no_cordon() -> None:
    assert cordon.current({"metadata": {"name": "n1"}}) == []


@pytest.mark.parametrize(("chip", "reason"), [(1, ""), (2000, "x"), (1, "x" * 257)])
def test_what_the_schema_refuses_is_refused_before_the_write(chip: int, reason: str) -> None:
    with pytest.raises(CliError, match=f"cannot cordon chip {chip}"):
        cordon.changed([], chip, reason)


def test_the_patch_is_guarded_by_the_spec_as_read() -> None:
    read = vnpu_node((3, "fan"), version="1234")
    body = cordon.patch_body(read, cordon.changed(cordon.current(read), 0, "dust"))
    listed = [{"chip": 0, "reason": "dust"}, {"chip": 3, "reason": "fan"}]
    # A status write (the agent's) changes the resourceVersion, not the spec: no conflict.
    assert body == [
        {"op": "test", "path": "/spec", "value": read["spec"]},
        {"op": "add", "path": "/spec/cordonedChips", "value": listed},
    ]
    assert jsonpatch.apply_patch(read, body)["spec"]["cordonedChips"] == listed
    changed = {**read, "spec": {"cordonedChips": [{"chip": 3, "reason": "dust"}]}}
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(changed, body)


def test_a_node_without_spec_is_guarded_by_its_resource_version() -> None:
    read = {"metadata": {"name": "n1", "resourceVersion": "7"}}
    assert cordon.patch_body(read, cordon.changed([], 1, "dust")) == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"cordonedChips": [{"chip": 1, "reason": "dust"}]},
    }


def test_messages_say_what_changed() -> None:
    fan = [CordonedChip(chip=3, reason="fan")]
    assert cordon.outcome("n1", 3, "fan", fan) == "vnpunode/n1 chip 3 already cordoned (fan)"
    assert cordon.outcome("n1", 3, "dust", fan) == "vnpunode/n1 chip 3 cordoned (dust)"
    assert cordon.outcome("n1", 3, None, fan) == "vnpunode/n1 chip 3 uncordoned"
    assert cordon.outcome("n1", 0, None, fan) == "vnpunode/n1 chip 0 was not cordoned"


def test_retries_pause_a_random_while_that_grows_with_the_attempt() -> None:
    # Writers that collided once must not collide again in lockstep.
    for attempt in range(1, cordon.ATTEMPTS):
        pauses = [cordon.retry_pause(attempt) for _ in range(50)]
        assert all(0 <= p <= cordon.RETRY_PAUSE_S * attempt for p in pauses)
        assert len(set(pauses)) > 1
    assert sum(cordon.RETRY_PAUSE_S * a for a in range(1, cordon.ATTEMPTS)) < 2
