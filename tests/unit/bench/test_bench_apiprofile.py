"""The API server's profile of the release, read by kind of work."""

from __future__ import annotations

from typing import Any

from bench.apiprofile import samples, shares
from bench.report import apiserver_rows

SEP = "-----------+-------------------------------------------------------"


def trace(weight: str, *frames: str) -> str:
    first, *rest = frames
    return "\n".join([f"{weight:>10}   {first}", *(f"{' ' * 13}{f}" for f in rest)])


TRACES = "\n".join(
    [
        "File: kube-apiserver",
        "Type: cpu",
        "Duration: 4s, Total samples = 1s (25%)",
        SEP,
        trace("350ms", "runtime.scanobject", "runtime.gcBgMarkWorker"),
        SEP,
        trace(
            "200ms",
            "encoding/json.Marshal",
            "k8s.io/apiextensions-apiserver/pkg/registry/customresource.(*StatusREST).Update",
            "k8s.io/apiserver/pkg/endpoints/handlers/finisher.finishRequest.func1",
        ),
        SEP,
        trace(
            "100ms",
            "k8s.io/apiextensions-apiserver/pkg/apiserver.(*crdHandler).ServeHTTP",
            "k8s.io/apiserver/pkg/endpoints/handlers.DeleteResource.func1",
        ),
        SEP,
        # A watch's encoding of a custom resource is the watch's, not the resource's.
        trace(
            "100ms",
            "k8s.io/apiextensions-apiserver/pkg/apiserver.(*crdHandler).ServeHTTP",
            "k8s.io/apiserver/pkg/endpoints/handlers.handleWatch",
        ),
        SEP,
        trace("0.15s", "crypto/x509.(*Certificate).Verify", "net/http.HandlerFunc.ServeHTTP"),
        SEP,
        trace("50ms", "runtime.futex", "runtime.mstart"),
        SEP,
        trace("50000us", "syscall.Syscall", "net/http.(*conn).serve"),
        SEP,
    ]
)


def test_each_trace_is_weighed_in_seconds_whatever_its_unit() -> None:
    weights = [round(seconds, 6) for seconds, _stack in samples(TRACES)]
    assert weights == [0.35, 0.2, 0.1, 0.1, 0.15, 0.05, 0.05]


def test_a_sample_counts_for_the_first_kind_its_stack_shows() -> None:
    got: dict[str, Any] = shares(TRACES)
    assert got["cpu_seconds"] == 1.0
    assert dict(got["shares"]) == {
        "garbage collection": 0.35,
        "custom resources": 0.3,
        "client certificate verification": 0.15,
        "watch fan-out": 0.1,
        "other": 0.05,
        "the rest of request handling": 0.05,
    }
    assert dict(got["custom_resources"]) == {"status write": 0.667, "delete": 0.333}


def test_no_traces_no_shares() -> None:
    assert shares("File: kube-apiserver\n") == {
        "cpu_seconds": 0.0,
        "shares": [],
        "custom_resources": [],
    }


def test_report_rows_give_the_shares_or_why_there_are_none() -> None:
    rows = apiserver_rows(shares(TRACES))
    assert rows[0] == (
        "  the API server's CPU (1.0 s profiled)",
        "garbage collection 35%, custom resources 30%, client certificate verification 15%, "
        "watch fan-out 10%, other 5%, the rest of request handling 5%",
    )
    assert rows[1] == ("    custom resources by request", "status write 67%, delete 33%")
    assert apiserver_rows({"error": "go is not installed"}) == [
        ("  the API server's CPU (profile)", "not read: go is not installed")
    ]
    assert apiserver_rows(None) == []
