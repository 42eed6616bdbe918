"""KEP-5304 device metadata from the kubelet plugin (vnpu_agent/dra/metadata.py,
prepare.py): the file's format and paths as k8s.io/dynamic-resource-allocation
v0.37.2 writes them, and its life with the claim: written at Prepare with the
specs that mount it, put back when Prepare is answered from the checkpoint,
gone at Unprepare.

testdata/kep5304-metadata-v0.37.2.json is the framework's own output for the
same claim: api/metadata.DeviceMetadata encoded by the kubeletplugin's
encoder (install.NewScheme, the JSON PrettySerializer, v1beta1 then v1alpha1,
a newline after each), from a Go program against the v0.37.2 module.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import allocation

from vnpu_agent import cdi
from vnpu_agent.dra import metadata
from vnpu_agent.dra.checkpoint import ClaimId, PreparedDevice
from vnpu_agent.dra.prepare import Preparer
from vnpu_common.wire import names

NODE = "n1"
NS = "team-a"
UID = "0b5c4a52-6d1e-4b5e-9d59-1f0c6ad0e001"
CLAIM = ClaimId(NS, UID, "c")
TEMPLATE = "vir05_1c_16g"
GOLDEN = Path(__file__).with_name("testdata") / "kep5304-metadata-v0.37.2.json"
ROOT = "/var/run/kubernetes.io/dra-device-attributes"


def _device(device: str, vnpu_id: int, chip: int, request: str = "npu") -> PreparedDevice:
    return PreparedDevice(request, NODE, device, vnpu_id, TEMPLATE, (), chip)


def test_the_file_is_the_frameworks_byte_for_byte() -> None:
    devices = [_device("npu-1-vir05-1c-16g-0", 116, 1), _device("npu-0-vir05-1c-16g-1", 101, 0)]
    text = metadata.document(CLAIM, "npu", "npu", devices, lambda _chip: "910B3")
    assert text == GOLDEN.read_text()
    first, second = metadata.read_objects(text)
    assert [first["apiVersion"], second["apiVersion"]] == list(names.DRA_METADATA_API_VERSIONS)
    assert first["requests"][0]["devices"][1]["attributes"]["vnpuId"] == {"int": 116}


def test_unknown_chip_and_model_are_left_out() -> None:
    """A version 1 checkpoint entry knows no chip, and an agent not told the
    models writes none: the attributes it knows, nothing made up."""
    text = metadata.document(CLAIM, None, "npu", [_device("npu-0-vir05-1c-16g-0", 100, -1)])
    (device,) = metadata.read_objects(text)[0]["requests"][0]["devices"]
    assert device["attributes"] == {"template": {"string": TEMPLATE}, "vnpuId": {"int": 100}}
    assert "podClaimName" not in metadata.read_objects(text)[0]


@pytest.mark.parametrize(
    ("pod_claim", "request_ref", "where"),
    [
        (None, "npu", f"{ROOT}/resourceclaims/c/npu/vnpu.io-metadata.json"),
        ("gpu", "npu", f"{ROOT}/resourceclaimtemplates/gpu/npu/vnpu.io-metadata.json"),
        # A subrequest of a prioritized list: the base request's directory.
        (None, "npu/small", f"{ROOT}/resourceclaims/c/npu/vnpu.io-metadata.json"),
        # The scheduler's claim for a container's extended resource (KEP-5004).
        (None, "container-1-request-0",
         f"{ROOT}/resourceclaims/c/container-1-request-0/vnpu.io-metadata.json"),
    ],
)  # fmt: skip
def test_the_container_path_follows_the_frameworks_rules(
    pod_claim: str | None, request_ref: str, where: str
) -> None:
    assert metadata.container_file(CLAIM, pod_claim, request_ref) == where


def test_the_host_path_is_per_claim_uid(tmp_path: Path) -> None:
    again = ClaimId(NS, "another-uid", "c")
    assert metadata.host_file(tmp_path, CLAIM, "npu/small") == (
        tmp_path / f"{NS}_c_{UID}" / "npu" / "metadata.json"
    )
    assert metadata.host_file(tmp_path, again, "npu") != metadata.host_file(tmp_path, CLAIM, "npu")


# -- with the plugin's Prepare and Unprepare -----------------------------------


def _claim(requests: dict[str, list[str]], pod_claim: str | None = None) -> dict[str, Any]:
    results = [
        {"request": r, "driver": names.DRA_DRIVER, "pool": NODE, "device": d}
        for r, devices in requests.items()
        for d in devices
    ]
    meta: dict[str, Any] = {"name": "c", "namespace": NS, "uid": UID}
    if pod_claim:
        meta["annotations"] = {names.DRA_POD_CLAIM_NAME_ANNOTATION: pod_claim}
    return {"metadata": meta, "status": {"allocation": {"devices": {"results": results}}}}


def _alloc(device: str, vnpu_id: int, request: str) -> dict[str, Any]:
    chip, _template, _n = names.parse_dra_device_name(device) or (0, TEMPLATE, 0)
    obj = allocation(names.dra_allocation_name(UID, device), vnpu_id)
    obj["spec"]["chip"] = chip
    obj["spec"]["claim"] = {"name": "c", "uid": UID, "request": request, "device": device}
    obj["status"] = {"phase": names.PHASE_READY}
    return obj


class Reader:
    def __init__(self, claim: dict[str, Any], *allocs: dict[str, Any]) -> None:
        self.claim = claim
        self.allocs = {a["metadata"]["name"]: a for a in allocs}
        self.claim_reads = 0

    async def resource_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.claim_reads += 1
        return copy.deepcopy(self.claim)

    async def allocation(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.allocs.get(name))


def _preparer(tmp_path: Path, reader: Reader, boot: str = "b1") -> Preparer:
    p = Preparer(NODE, reader, tmp_path / "state" / "checkpoint.json", tmp_path / "cdi",
                 Path("/dev"), boot_id=boot)  # fmt: skip
    p.chip_model = {0: "910B3", 1: "910B3"}.get
    return p


def _spec(tmp_path: Path, device: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(
        cdi.claim_spec_path(tmp_path / "cdi", UID, device).read_text()
    )
    return spec


def _two_requests() -> Reader:
    requests = {"small": ["npu-0-vir05-1c-16g-1", "npu-1-vir05-1c-16g-0"],
                "other": ["npu-0-vir05-1c-16g-2"]}  # fmt: skip
    ids = {"npu-0-vir05-1c-16g-1": 101, "npu-1-vir05-1c-16g-0": 116, "npu-0-vir05-1c-16g-2": 102}
    allocs = [_alloc(d, ids[d], r) for r, devices in requests.items() for d in devices]
    return Reader(_claim(requests, pod_claim="npu"), *allocs)


async def test_prepare_writes_a_file_per_request_and_mounts_it_with_its_devices(
    tmp_path: Path,
) -> None:
    p = _preparer(tmp_path, _two_requests())
    result = (await p.prepare([CLAIM]))[UID]
    assert result.error == ""
    # The answer is unchanged: the mount rides on the devices' own specs.
    assert [d.cdi_ids for d in result.devices] == [
        (cdi.claim_device_id(UID, d.device),) for d in result.devices
    ]

    small = p.metadata_dir / f"{NS}_c_{UID}" / "small" / "metadata.json"
    (obj, _older) = metadata.read_objects(small.read_text())
    assert obj["podClaimName"] == "npu"
    assert [(d["name"], d["attributes"]["vnpuId"]["int"], d["attributes"]["model"]["string"])
            for d in obj["requests"][0]["devices"]] == [
        ("npu-0-vir05-1c-16g-1", 101, "910B3"), ("npu-1-vir05-1c-16g-0", 116, "910B3")
    ]  # fmt: skip
    assert oct(small.stat().st_mode & 0o777) == "0o644"

    for device, request, env in [
        ("npu-0-vir05-1c-16g-1", "small", ("101,116", "0,1")),
        ("npu-1-vir05-1c-16g-0", "small", ("101,116", "0,1")),
        ("npu-0-vir05-1c-16g-2", "other", ("102", "0")),
    ]:
        edits = _spec(tmp_path, device)["devices"][0]["containerEdits"]
        (mount,) = edits["mounts"]
        assert mount["hostPath"] == str(
            p.metadata_dir / f"{NS}_c_{UID}" / request / "metadata.json"
        )
        assert mount["containerPath"] == (
            f"{ROOT}/resourceclaimtemplates/npu/{request}/vnpu.io-metadata.json"
        )
        assert f"ASCEND_VISIBLE_DEVICES={env[0]}" in edits["env"]
        assert f"ASCEND_RT_VISIBLE_DEVICES={env[1]}" in edits["env"]

    assert await p.unprepare([CLAIM]) == {UID: ""}
    assert not (p.metadata_dir / f"{NS}_c_{UID}").exists()
    assert not list((tmp_path / "cdi").iterdir())


async def test_a_retry_puts_the_metadata_back_without_asking_the_api(tmp_path: Path) -> None:
    reader = _two_requests()
    p = _preparer(tmp_path, reader)
    first = await p.prepare([CLAIM])
    files = sorted(p.metadata_dir.rglob("metadata.json"))
    texts = [f.read_text() for f in files]
    spec = cdi.claim_spec_path(tmp_path / "cdi", UID, "npu-1-vir05-1c-16g-0")
    spec.unlink()
    files[0].unlink()
    reads = reader.claim_reads
    assert await p.prepare([CLAIM]) == first
    # The other request's file still said which pod claim name it was for.
    assert reader.claim_reads == reads
    assert [f.read_text() for f in files] == texts
    assert json.loads(spec.read_text())["devices"][0]["containerEdits"]["mounts"]


async def test_a_retry_with_no_file_left_reads_the_claim_once(tmp_path: Path) -> None:
    """The metadata directory gone (or an agent that wrote none prepared the
    claim): the pod claim name comes from the claim again."""
    reader = _two_requests()
    p = _preparer(tmp_path, reader)
    await p.prepare([CLAIM])
    texts = {f: f.read_text() for f in p.metadata_dir.rglob("metadata.json")}
    for f in texts:
        f.unlink()
    reads = reader.claim_reads
    assert (await p.prepare([CLAIM]))[UID].error == ""
    assert reader.claim_reads == reads + 1
    assert {f: f.read_text() for f in texts} == texts


async def test_a_retry_for_a_claim_made_again_is_refused(tmp_path: Path) -> None:
    reader = _two_requests()
    p = _preparer(tmp_path, reader)
    await p.prepare([CLAIM])
    for f in p.metadata_dir.rglob("metadata.json"):
        f.unlink()
    reader.claim["metadata"]["uid"] = "someone-else"
    error = (await p.prepare([CLAIM]))[UID].error
    assert "gone or made again since it was prepared" in error


async def test_after_a_reboot_the_file_is_written_anew(tmp_path: Path) -> None:
    """A new boot: the checkpoint's entry holds nothing, Prepare checks it all
    again and writes the file and specs (the CDI directory is often a tmpfs)."""
    reader = _two_requests()
    await _preparer(tmp_path, reader).prepare([CLAIM])
    for path in (tmp_path / "cdi").iterdir():
        path.unlink()
    files = {f: f.read_text() for f in (tmp_path / "state").rglob("metadata.json")}
    for f in files:
        f.unlink()
    rebooted = _preparer(tmp_path, reader, boot="b2")
    assert (await rebooted.prepare([CLAIM]))[UID].error == ""
    assert {f: f.read_text() for f in files} == files
    assert len(list((tmp_path / "cdi").iterdir())) == 3


async def test_a_claim_the_pod_names_is_under_resourceclaims(tmp_path: Path) -> None:
    device = "npu-1-vir05-1c-16g-0"
    p = _preparer(tmp_path, Reader(_claim({"npu": [device]}), _alloc(device, 116, "npu")))
    assert (await p.prepare([CLAIM]))[UID].error == ""
    edits = _spec(tmp_path, device)["devices"][0]["containerEdits"]
    assert (
        edits["mounts"][0]["containerPath"] == f"{ROOT}/resourceclaims/c/npu/vnpu.io-metadata.json"
    )
    assert "ASCEND_RT_VISIBLE_DEVICES=0" in edits["env"]
