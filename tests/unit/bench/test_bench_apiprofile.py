"""The API server's profile of the release, read by kind of work."""

from __future__ import annotations

from typing import Any

from bench.apiprofile import samples, shares
from bench.report import apiserver_ms_per_pod, apiserver_rows, phase_apiserver_rows

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


WEBHOOK_TRACES = "\n".join(
    [
        "File: kube-apiserver",
        SEP,
        # A webhook call's own stack and its connection's goroutine both count
        # as the webhooks', though the second shows no admission frame.
        trace(
            "300ms",
            "encoding/json.Marshal",
            "k8s.io/apiserver/pkg/admission/plugin/webhook/mutating.(*mutatingDispatcher).Dispatch",
            "net/http.HandlerFunc.ServeHTTP",
        ),
        SEP,
        trace("100ms", "crypto/tls.(*Conn).Write", "net/http.(*persistConn).writeLoop"),
        SEP,
        trace(
            "200ms",
            "k8s.io/kubernetes/pkg/registry/core/event.(*strategy).Validate",
            "net/http.HandlerFunc.ServeHTTP",
        ),
        SEP,
        trace("400ms", "runtime.scanobject", "runtime.gcBgMarkWorker"),
        SEP,
    ]
)


def test_the_churn_rows_give_ms_per_pod_ours_beside_the_floor_largest_excess_first() -> None:
    ours = shares(WEBHOOK_TRACES)
    assert dict(ours["shares"]) == {
        "admission webhooks": 0.4,
        "garbage collection": 0.4,
        "Events' storage": 0.2,
    }
    floor = shares(TRACES)
    r = {
        "config": {"pods": 100},
        "churn_apiserver_cpu": ours,
        "floor": {"churn_apiserver_cpu": floor},
    }
    rows = phase_apiserver_rows(r)
    assert rows[0] == (
        "  API server CPU ms per pod in the churn (profile), ours / floor",
        "10.0 / 10.0",
    )
    # 1.0 s over 100 pods: the webhooks' 0.4 s is 4 ms a pod, none of it the floor's.
    assert rows[1] == ("    admission webhooks", "4.0 / -")
    assert rows[2] == ("    Events' storage", "2.0 / -")
    by_kind = dict(rows[1:])
    assert by_kind["    garbage collection"] == "4.0 / 3.5"
    assert by_kind["    custom resources"] == "0.0 / 3.0"
    assert apiserver_ms_per_pod({"error": "no go"}, 100) == {}
    assert phase_apiserver_rows({"config": {"pods": 1}}) == []


def test_the_burst_rows_divide_by_the_bursts_own_pods() -> None:
    r = {
        "config": {"pods": 1000},
        "burst_apiserver_cpu": shares(WEBHOOK_TRACES),
        "floor": {"burst_apiserver_cpu": shares(TRACES)},
    }
    rows = phase_apiserver_rows(r, "burst", 50)
    assert rows[0] == (
        "  API server CPU ms per pod in the burst (profile), ours / floor",
        "20.0 / 20.0",
    )
    assert rows[1] == ("    admission webhooks", "8.0 / -")
    assert phase_apiserver_rows(r) == []
