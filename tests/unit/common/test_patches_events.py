import jsonpatch
import pytest

from vnpu_common.wire.events import MESSAGE_MAX, event_body
from vnpu_common.wire.patches import finalizer_removal, json_pointer


def test_json_pointer_escapes_each_token() -> None:
    assert json_pointer("metadata", "annotations", "vnpu.io/a~b") == (
        "/metadata/annotations/vnpu.io~1a~0b"
    )
    assert json_pointer("spec", "containers", 0, "-") == "/spec/containers/0/-"


def test_finalizer_removal_takes_only_ours_of_the_object_it_was_read_from() -> None:
    meta = {"uid": "u1", "finalizers": ["other/keep", "vnpu.io/release"]}
    ops = finalizer_removal(meta, "vnpu.io/release")
    assert ops is not None
    doc = {"metadata": dict(meta, finalizers=list(meta["finalizers"]))}
    assert jsonpatch.apply_patch(doc, ops)["metadata"]["finalizers"] == ["other/keep"]
    # The same patch against a replacement object (new uid) or a changed list fails.
    replaced = {"metadata": {"uid": "u2", "finalizers": ["other/keep", "vnpu.io/release"]}}
    reordered = {"metadata": {"uid": "u1", "finalizers": ["vnpu.io/release", "other/keep"]}}
    for target in (replaced, reordered):
        with pytest.raises(jsonpatch.JsonPatchTestFailed):
            jsonpatch.apply_patch(target, ops)


def test_no_finalizer_no_patch() -> None:
    assert finalizer_removal({"uid": "u1", "finalizers": ["x"]}, "vnpu.io/release") is None
    assert finalizer_removal({}, "vnpu.io/release") is None


def test_event_body_names_the_object_and_bounds_the_message() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7"}}
    body = event_body(
        pod, reason="VNPUsReady", message="x" * 5000, warning=True, component="c", host="h"
    )
    assert body["metadata"] == {"generateName": "p.", "namespace": "ns"}
    assert body["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns", "uid": "u",
        "resourceVersion": "7",
    }  # fmt: skip
    assert (body["type"], body["reason"], len(body["message"])) == (
        "Warning", "VNPUsReady", MESSAGE_MAX,
    )  # fmt: skip
    assert (body["reportingComponent"], body["reportingInstance"]) == ("c", "h")
