"""The bench's split of an agent's CPU: its worker threads (the driver calls)
apart from its main thread (the agent's own code)."""

from __future__ import annotations

import os
import threading
import time

from bench.cluster import worker_threads_cpu


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_counts_worker_threads_and_not_the_main_thread() -> None:
    pid = os.getpid()
    before = worker_threads_cpu(pid)

    _burn(0.3)  # the main thread: must not count
    after_main = worker_threads_cpu(pid)
    assert after_main - before < 0.1

    done = threading.Event()
    burned = threading.Event()

    def worker() -> None:
        _burn(0.3)
        burned.set()
        done.wait(10)  # still alive when counted: an exited thread leaves /proc

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert burned.wait(10)
        assert worker_threads_cpu(pid) - after_main >= 0.25
    finally:
        done.set()
        thread.join()
