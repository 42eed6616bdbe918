"""`python -m bench --pyspy`: py-spy's raw stacks read into inclusive shares."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench.stacks import Sampler, frame_name, profile

OP = "/work/main/operator/vnpu_operator"
SP = "/opt/venv/lib/python3.11/site-packages"
MAIN = (
    "_run_module_as_main (<frozen runpy>:198);_run_code (<frozen runpy>:88);"
    f"<module> ({OP}/main.py:100);main ({OP}/main.py:96);"
    "run (/work/main/common/vnpu_common/process/eventloop.py:24);"
    "Runner.run (/usr/lib/python3.11/asyncio/runners.py:118)"
)


THREAD = (
    "Thread._bootstrap (/usr/lib/python3.11/threading.py:995);"
    "Thread._bootstrap_inner (/usr/lib/python3.11/threading.py:1038);"
    "Thread.run (/usr/lib/python3.11/threading.py:975);"
    "_worker (/usr/lib/python3.11/concurrent/futures/thread.py:83)"
)


def test_frame_names_drop_lines_and_the_path_up_to_the_package() -> None:
    assert frame_name(f"Controller.reconcile ({OP}/controller.py:406)") == (
        "Controller.reconcile (vnpu_operator/controller.py)"
    )
    assert frame_name(f"ClientSession._request ({SP}/aiohttp/client.py:558)") == (
        "ClientSession._request (aiohttp/client.py)"
    )
    assert frame_name("Runner.run (/usr/lib/python3.11/asyncio/runners.py:118)") == (
        "Runner.run (asyncio/runners.py)"
    )
    assert frame_name("_run_code (<frozen runpy>:88)") == "_run_code (<frozen runpy>)"
    assert frame_name("no parentheses") == "no parentheses"


def test_shares_are_inclusive_counted_once_per_stack_and_leave_out_the_roots() -> None:
    raw = textwrap.dedent(f"""\
        {MAIN};reconcile ({OP}/controller.py:406);_write ({OP}/kubeapi.py:88) 30
        {MAIN};reconcile ({OP}/controller.py:406);decide ({OP}/lifecycle.py:179) 10
        {MAIN};reconcile ({OP}/controller.py:406);reconcile ({OP}/controller.py:420) 10
        {MAIN};_watch (/work/main/common/vnpu_common/kube/informer.py:171) 20
        {MAIN} 30
        {THREAD};create (/work/main/node_agent/vnpu_agent/drivers/sim.py:80) 25
        not a stack line
        """)
    prof = profile(raw)
    assert prof.samples == 125
    shares = dict(prof.top)
    # 30 + 10 + 10: the recursion's second frame is not counted twice.
    assert shares["reconcile (vnpu_operator/controller.py)"] == 50 / 125
    assert shares["_write (vnpu_operator/kubeapi.py)"] == 30 / 125
    assert shares["_watch (vnpu_common/kube/informer.py)"] == 20 / 125
    assert shares["decide (vnpu_operator/lifecycle.py)"] == 10 / 125
    # A worker thread's samples show under the executor's worker and what it ran.
    assert shares["_worker (concurrent/futures/thread.py)"] == 25 / 125
    assert shares["create (vnpu_agent/drivers/sim.py)"] == 25 / 125
    assert not any(
        name.startswith(("Runner.run", "main ", "<module>", "Thread.")) for name in shares
    )
    assert prof.top[0][0] == "reconcile (vnpu_operator/controller.py)"
    # The samples in uvloop's C code, under the loop's own frame.
    assert prof.loop_share == 30 / 125
    assert prof.to_json()["loop_share"] == round(30 / 125, 4)


def test_no_samples_is_an_empty_profile() -> None:
    prof = profile("")
    assert (prof.samples, prof.top, prof.loop_share) == (0, [], 0.0)


def test_the_sampler_finds_where_a_real_process_spends_its_cpu(tmp_path: Path) -> None:
    """py-spy on a live process: reading another process's memory needs
    ptrace rights (root, as CI runs; or ptrace_scope 0)."""
    busy = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""\
            def spin_here():
                while True:
                    sum(range(1000))

            spin_here()
            """)],
    )  # fmt: skip
    try:
        sampler = Sampler({"busy": busy.pid}, tmp_path)
        sampler.start()
        time.sleep(2.0)
        prof = sampler.stop()["busy"]
    finally:
        busy.kill()
        busy.wait()
    log = (tmp_path / "busy.pyspy.log").read_text()
    assert prof.samples > 50, f"py-spy took too few samples: {prof}; its log: {log}"
    shares = dict(prof.top)
    assert shares.get("spin_here (<string>)", 0) > 0.9, prof.top


def test_pyspy_operator_samples_the_operator_alone() -> None:
    from bench.run import parse, sampled_pids

    pids = {"vnpu-operator": 10, "vnpu-agent-0": 11, "vnpu-agent-1": 12}
    assert sampled_pids(pids, parse(["--pyspy", "operator"]).pyspy) == {"vnpu-operator": 10}
    assert sampled_pids(pids, parse(["--pyspy"]).pyspy) == pids
    assert parse([]).pyspy is None
