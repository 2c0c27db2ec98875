"""`make run`'s supervisor restarts a service that dies, with doubling backoff, and logs each restart.

The children are real processes (a Python one-liner that exits, and a real gateway that is killed),
supervised by the real watch loop.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import time

import pytest

from scripts.launch import free_port, http_ok
from scripts.run_stack import Backoff, Child, Stack, StackSettings
from tests.support.net import wait_for


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(initial_s=1.0, max_s=5.0)
    assert [backoff.delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def supervise(capsys: pytest.CaptureFixture[str], code: str, restarts: int, **settings: float) -> list[float]:
    """Run one child under the watch loop until it was restarted `restarts` times; the delays logged."""
    stack = Stack(StackSettings(**settings))
    child = Child("flaky", [sys.executable, "-c", code])
    stack.children.append(child)
    child.start()
    watcher = threading.Thread(target=stack.watch, daemon=True)
    watcher.start()
    deadline = time.monotonic() + 20
    while child.restarts < restarts and time.monotonic() < deadline:
        time.sleep(0.02)
    stack.stopping.set()
    watcher.join(5)
    stack.down()
    out = capsys.readouterr().out
    assert child.restarts >= restarts, out
    assert out.count("restarting flaky") == child.restarts
    assert "flaky exited (code 3)" in out
    return [float(d) for d in re.findall(r"restarting in ([0-9.]+) s", out)]


def test_a_child_that_keeps_dying_is_restarted_with_growing_delays(
    capsys: pytest.CaptureFixture[str],
) -> None:
    delays = supervise(capsys, "import sys; sys.exit(3)", 4, restart_backoff_s=0.1, restart_backoff_max_s=0.4)
    assert delays[:4] == [0.1, 0.2, 0.4, 0.4]


def test_a_run_that_lasted_starts_the_backoff_over(capsys: pytest.CaptureFixture[str]) -> None:
    code = "import sys, time; time.sleep(0.3); sys.exit(3)"
    settings = {"restart_backoff_s": 0.1, "restart_backoff_max_s": 10.0, "restart_stable_after_s": 0.2}
    delays = supervise(capsys, code, 3, **settings)
    assert delays[:3] == [0.1, 0.1, 0.1]


def test_a_killed_service_is_restarted_and_serves_again(capsys: pytest.CaptureFixture[str]) -> None:
    """A real gateway under the watch loop, killed as the OOM killer would: restarted on its port, logged."""
    port = free_port()
    env = {
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": str(port),
        "WORKER_ADDR": f"127.0.0.1:{free_port()}",  # no worker: /health is the gateway's own liveness
        "CACHE_ENABLED": "false",
    }
    stack = Stack(StackSettings(restart_backoff_s=0.1))
    health = f"http://127.0.0.1:{port}/health"
    watcher = threading.Thread(target=stack.watch, daemon=True)
    try:
        gateway = stack.python("gateway", "gateway", env)
        wait_for(lambda: http_ok(health), 60, "the gateway to answer")
        watcher.start()
        assert gateway.proc is not None
        first = gateway.proc
        first.kill()
        wait_for(lambda: gateway.restarts == 1 and http_ok(health), 60, "the gateway to come back")
        assert gateway.proc is not first and first.returncode == -signal.SIGKILL
    finally:
        stack.stopping.set()
        if watcher.is_alive():
            watcher.join(5)
        stack.down()
    out = capsys.readouterr().out
    assert "[run] gateway exited (code -9)" in out and "[run] restarting gateway" in out
