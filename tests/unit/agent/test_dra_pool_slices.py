"""The ResourceSlices of a DRA node's pool (vnpu_agent.dra.slices): what
docs/DRA.md, "What the agent publishes", promises, within resource.k8s.io/v1's
limits. The API server's own validation of these slices is
tests/integration/test_dra_slices.py."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from vnpu_agent.dra import slices
from vnpu_agent.drivers.catalog import CATALOG
from vnpu_common.wire import names
from vnpu_common.wire.models import ChipStatus, TemplateResources

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def chip(index: int, model: str = "910B3", *, healthy: bool = True) -> ChipStatus:
    """Chip `index` of `model` as the agent publishes it (catalog sizes, the
    id range of physical chip `index`)."""
    m = CATALOG[model]
    low, high = m.id_range(index)
    return ChipStatus(
        index=index, physical_id=index, card_id=index, device_id=0, model=model,
        health="Healthy" if healthy else "Unhealthy",
        aicore_total=m.aicore, aicore_free=m.aicore, memory_total_mb=m.memory_mb,
        memory_free_mb=m.memory_mb, aicpu_total=m.aicpu, aicpu_free=m.aicpu,
        media_total=m.media, media_free=m.media, vnpu_id_min=low, vnpu_id_max=high,
        templates=[
            TemplateResources(name=t.name, aicore=t.aicore, memory_mb=t.memory_mb,
                              aicpu=t.aicpu, media=t.media)
            for t in m.templates
        ],
    )  # fmt: skip


def devices(pool: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in pool for d in s["spec"].get("devices", [])]


def counter_sets(pool: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for s in pool for c in s["spec"].get("sharedCounters", [])]


def templates_of(pool: list[dict[str, Any]]) -> Counter[str]:
    return Counter(d["attributes"][names.DRA_ATTR_TEMPLATE]["string"] for d in devices(pool))


def check_v1_limits(pool: list[dict[str, Any]], node: str) -> None:
    """What resource.k8s.io/v1 validation asks of each slice (those rules the
    integration test's API server checks for real)."""
    seen_devices: set[str] = set()
    seen_sets: set[str] = set()
    generations = {s["spec"]["pool"]["generation"] for s in pool}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in pool}
    assert len(generations) == 1
    assert counts == {len(pool)}
    assert len({s["metadata"]["name"] for s in pool}) == len(pool)
    for s in pool:
        spec = s["spec"]
        assert s["apiVersion"] == "resource.k8s.io/v1"
        assert s["kind"] == "ResourceSlice"
        assert len(s["metadata"]["name"]) <= 253
        assert DNS_SUBDOMAIN.match(s["metadata"]["name"])
        assert spec["driver"] == names.DRA_DRIVER == "vnpu.io"
        assert spec["nodeName"] == node
        assert spec["pool"]["name"] == node
        assert ("devices" in spec) != ("sharedCounters" in spec)
        assert len(spec.get("sharedCounters", [])) <= 8
        assert 0 < len(spec.get("devices", [None])) <= 64
        for cs in spec.get("sharedCounters", []):
            assert DNS_LABEL.match(cs["name"])
            assert cs["name"] not in seen_sets
            seen_sets.add(cs["name"])
            assert 0 < len(cs["counters"]) <= 32
            assert all(DNS_LABEL.match(k) for k in cs["counters"])
            assert all(re.fullmatch(r"[0-9]+", c["value"]) for c in cs["counters"].values())
        for d in spec.get("devices", []):
            assert len(d["name"]) <= 63
            assert DNS_LABEL.match(d["name"])
            assert d["name"] not in seen_devices
            seen_devices.add(d["name"])
            assert len(d.get("attributes", {})) + len(d.get("capacity", {})) <= 32
            assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,31}", k) for k in d["attributes"])
            assert len(d["consumesCounters"]) <= 2
            assert len(d.get("taints", [])) <= 16
            assert len(d["bindingConditions"]) <= 4
            assert len(d["bindingFailureConditions"]) <= 4
    for d in devices(pool):
        for used in d["consumesCounters"]:
            assert used["counterSet"] in seen_sets


def test_a_910b3_gives_four_vir05_and_two_vir10_on_its_own_counter_set() -> None:
    pool = slices.pool_slices([chip(0)], [], "n1", 3, node_uid="uid-n1")
    check_v1_limits(pool, "n1")
    assert [s["metadata"]["name"] for s in pool] == ["n1-vnpu-counters-000", "n1-vnpu-devices-000"]
    assert counter_sets(pool) == [
        {
            "name": "npu-0",
            "counters": {
                "aicore": {"value": "20"}, "memory-mb": {"value": "65536"},
                "aicpu": {"value": "7"}, "media": {"value": "9"}, "vnpus": {"value": "16"},
            },
        }
    ]  # fmt: skip
    assert templates_of(pool) == {"vir05_1c_16g": 4, "vir10_3c_32g": 2}
    assert [d["name"] for d in devices(pool)] == [
        "npu-0-vir05-1c-16g-0", "npu-0-vir05-1c-16g-1", "npu-0-vir05-1c-16g-2",
        "npu-0-vir05-1c-16g-3", "npu-0-vir10-3c-32g-0", "npu-0-vir10-3c-32g-1",
    ]  # fmt: skip
    vir10 = devices(pool)[4]
    assert vir10 == {
        "name": "npu-0-vir10-3c-32g-0",
        "attributes": {
            "template": {"string": "vir10_3c_32g"}, "model": {"string": "910B3"},
            "chip": {"int": 0}, "aicore": {"int": 10}, "memoryMB": {"int": 32768},
        },
        "consumesCounters": [{"counterSet": "npu-0", "counters": {
            "aicore": {"value": "10"}, "memory-mb": {"value": "32768"},
            "aicpu": {"value": "3"}, "media": {"value": "4"}, "vnpus": {"value": "1"},
        }}],
        "bindsToNode": True,
        "bindingConditions": ["vnpu.io/vnpu-ready"],
        "bindingFailureConditions": ["vnpu.io/vnpu-failed"],
    }  # fmt: skip
    for s in pool:
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-n1"}
        ]
        assert s["spec"]["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 2}


def test_a_310p3_gives_twenty_devices_and_eight_more_in_the_room_beside_its_vir04() -> None:
    pool = slices.pool_slices([chip(0, "310P3")], [], "n1", 1)
    check_v1_limits(pool, "n1")
    own = [d for d in devices(pool) if "room-aicpu" not in d["consumesCounters"][0]["counters"]]
    # vir01: 8 AICore, 8 media, 24 GB / 3 GB = 8, but 7 AICPU; vir04_3c_ndvpp
    # takes no media (no media counter consumed); vir04_4c_dvpp takes all 8.
    assert templates_of([{"spec": {"devices": own}}]) == {
        "vir01": 7, "vir02": 3, "vir02_1c": 4, "vir04": 1,
        "vir04_3c": 2, "vir04_3c_ndvpp": 2, "vir04_4c_dvpp": 1,
    }  # fmt: skip
    # The room beside one vir04: 4 AICore, 12 GB, 3 AICPU, 4 media, 7 ids.
    assert counter_sets(pool)[0]["counters"] == {
        "aicore": {"value": "8"}, "memory-mb": {"value": "24576"}, "aicpu": {"value": "7"},
        "media": {"value": "8"}, "vnpus": {"value": "8"},
        "room-aicore": {"value": "4"}, "room-memory-mb": {"value": "12288"},
        "room-aicpu": {"value": "3"}, "room-media": {"value": "4"}, "room-vnpus": {"value": "7"},
    }  # fmt: skip
    # First in the pool: what fits in that room, numbered on from the chip's own.
    listed = [d["name"] for d in devices(pool)]
    assert listed[:8] == [
        "npu-0-vir01-7", "npu-0-vir01-8", "npu-0-vir01-9", "npu-0-vir02-3",
        "npu-0-vir02-1c-4", "npu-0-vir02-1c-5", "npu-0-vir04-3c-2", "npu-0-vir04-3c-ndvpp-2",
    ]  # fmt: skip
    assert listed[8:] == [d["name"] for d in own]
    assert len(listed) == 28
    room_vir01 = devices(pool)[0]["consumesCounters"]
    assert room_vir01 == [{"counterSet": "npu-0", "counters": {
        "aicore": {"value": "1"}, "memory-mb": {"value": "3072"}, "aicpu": {"value": "1"},
        "media": {"value": "1"}, "vnpus": {"value": "1"},
        "room-aicore": {"value": "1"}, "room-memory-mb": {"value": "3072"},
        "room-aicpu": {"value": "1"}, "room-media": {"value": "1"}, "room-vnpus": {"value": "1"},
    }}]  # fmt: skip
    ndvpp = next(d for d in devices(pool) if d["name"] == "npu-0-vir04-3c-ndvpp-0")
    assert "media" not in ndvpp["consumesCounters"][0]["counters"]
    assert "metadata" in pool[0]
    assert "ownerReferences" not in pool[0]["metadata"]
    # Every name the operator reads back names the chip and template.
    parsed = [names.parse_dra_device_name(n) for n in listed[:8]]
    assert {p[:2] for p in parsed if p} == {
        (0, t) for t in ("vir01", "vir02", "vir02_1c", "vir04_3c", "vir04_3c_ndvpp")
    }
    assert None not in parsed


def test_room_devices_come_first_on_the_node_then_each_chip_in_turn() -> None:
    pool = slices.pool_slices([chip(i, "310P3") for i in range(3)], [], "n1", 1)
    check_v1_limits(pool, "n1")
    order = [(d["name"], "room-aicpu" in d["consumesCounters"][0]["counters"])
             for d in devices(pool)]  # fmt: skip
    assert [room for _, room in order] == [True] * 24 + [False] * 60
    chips_in_order = [int(n.split("-")[1]) for n, _ in order]
    assert chips_in_order == sorted(chips_in_order[:24]) + sorted(chips_in_order[24:])


def test_only_a_chip_with_room_beside_its_largest_template_has_room_devices() -> None:
    # Two vir10 fill a 910B3, two vir16 a 910; one vir16 leaves 14 of a 910ProB's 30 AICore.
    assert slices.room(chip(0)) is None
    assert slices.room(chip(0, "910")) is None
    assert slices.room_devices(chip(0, "910"), cordoned=False) == []
    pro = slices.room_devices(chip(0, "910ProB"), cordoned=False)
    assert templates_of([{"spec": {"devices": pro}}]) == {"vir02": 7, "vir04": 3, "vir08": 1}
    # A cordoned or unhealthy chip offers no room device either; its room counters stay.
    assert slices.room_devices(chip(0, "310P3"), cordoned=True) == []
    assert slices.room_devices(chip(0, "310P3", healthy=False), cordoned=False) == []
    pool = slices.pool_slices([chip(0, "310P3")], [0], "n1", 1)
    assert devices(pool) == []
    assert "room-aicpu" in counter_sets(pool)[0]["counters"]


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_every_catalog_model_fits_the_limits(model: str) -> None:
    pool = slices.pool_slices([chip(i, model) for i in range(8)], [0], "n1", 1)
    check_v1_limits(pool, "n1")
    assert len(devices(pool)) > 0


def test_sixteen_chips_make_two_counter_slices_of_eight_and_device_slices_of_at_most_64() -> None:
    chips = [chip(i, "310P3") for i in range(16)]  # 28 devices each: 448
    pool = slices.pool_slices(chips, [], "big", 7)
    check_v1_limits(pool, "big")
    kinds = [s["metadata"]["name"].rsplit("-", 2)[1] for s in pool]
    assert kinds == ["counters"] * 2 + ["devices"] * 7
    assert [len(s["spec"]["sharedCounters"]) for s in pool[:2]] == [8, 8]
    per_slice = [len(s["spec"]["devices"]) for s in pool[2:]]
    # Cut from the pool's device order: full slices, the rest in the last.
    assert per_slice == [64] * 7
    assert len(devices(pool)) == 448
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in pool} == {9}
    assert {s["spec"]["pool"]["generation"] for s in pool} == {7}


def test_a_chip_with_more_than_64_devices_is_split() -> None:
    many = chip(0).model_copy(
        update={
            "templates": [TemplateResources(name="vir01", aicore=0, memory_mb=0, aicpu=0)],
            "vnpu_id_min": 100, "vnpu_id_max": 199,
        }
    )  # fmt: skip
    pool = slices.pool_slices([many, chip(1)], [], "n1", 1)
    check_v1_limits(pool, "n1")
    # A template taking nothing is bounded by the id range: 100 instances.
    assert [len(s["spec"].get("devices", [])) for s in pool] == [0, 64, 42]


def test_unhealthy_and_cordoned_chips_offer_no_device_and_keep_their_counters() -> None:
    pool = slices.pool_slices(
        [
            chip(0),
            chip(1, healthy=False),
            chip(2),
            chip(3).model_copy(update={"health": "Unknown"}),
        ],
        [1, 2],
        "n1",
        1,
    )
    check_v1_limits(pool, "n1")
    # Absent, not tainted: a request tolerating every taint finds nothing on
    # chips 1 (unhealthy and cordoned), 2 (cordoned) or 3 (health unknown).
    assert {d["name"].split("-")[1] for d in devices(pool)} == {"0"}
    assert not any("taints" in d for d in devices(pool))
    assert len(devices(pool)) == 6
    # Their counter sets stay: devices already allocated there are still counted.
    assert [c["name"] for c in counter_sets(pool)] == ["npu-0", "npu-1", "npu-2", "npu-3"]


def test_vnpus_on_a_chip_change_nothing() -> None:
    empty = chip(0)
    busy = empty.model_copy(update={"aicore_free": 0, "memory_free_mb": 0, "aicpu_free": 0})
    assert slices.pool_slices([empty], [], "n1", 1) == slices.pool_slices([busy], [], "n1", 1)


def test_no_chips_no_slices() -> None:
    assert slices.pool_slices([], [], "n1", 1) == []


def test_a_chip_without_templates_has_its_counter_set_and_no_devices() -> None:
    bare = chip(0).model_copy(update={"templates": []})
    pool = slices.pool_slices([bare], [], "n1", 1)
    assert [s["metadata"]["name"] for s in pool] == ["n1-vnpu-counters-000"]


def test_slice_names_of_a_long_node_stay_valid_and_distinct() -> None:
    long = ("a" * 60 + ".") * 4 + "b" * 9  # 253 characters, the longest node name
    other = long[:-1] + "c"
    assert len(long) == 253
    made = {slices.slice_name(n, "devices", i) for n in (long, other) for i in (0, 10)}
    assert len(made) == 4
    for name in made:
        assert len(name) <= 253, name
        assert DNS_SUBDOMAIN.match(name), name
    assert slices.slice_name("n1", "counters", 2) == "n1-vnpu-counters-002"


def test_slices_sort_by_name_in_the_order_they_were_cut() -> None:
    """The scheduler walks slices in order of their names: unpadded, slice
    10 sorted before slice 2 and the device order the pool lists was lost."""
    many = chip(0).model_copy(
        update={
            "templates": [TemplateResources(name="vir01", aicore=0, memory_mb=0, aicpu=0)],
            "vnpu_id_min": 100, "vnpu_id_max": 199,
        }
    )  # fmt: skip
    chips = [many.model_copy(update={"index": i}) for i in range(8)]  # 800 devices
    pool = slices.pool_slices(chips, [], "n1", 1)
    check_v1_limits(pool, "n1")
    named = [s["metadata"]["name"] for s in pool]
    assert len([n for n in named if "-devices-" in n]) > 10
    assert sorted(named) == named
    walked = [d["name"] for s in sorted(pool, key=lambda s: s["metadata"]["name"])
              for d in s["spec"].get("devices", [])]  # fmt: skip
    assert walked == [d["name"] for d in devices(pool)]
