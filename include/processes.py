"""Stopping detached process groups (the stream, Airflow standalone, the live generator)."""

from __future__ import annotations

import os
import signal
import time


def process_alive(pid: int | None) -> bool:
    """True while the process exists and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return True


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, grace_seconds: float = 60.0) -> None:
    """SIGTERM every process of the group, then SIGKILL whatever is left after the grace period.
    SIGCONT follows the SIGTERM: a stopped process (SIGSTOP, a debugger, a frozen container) acts
    on it only once continued, and would otherwise sit out the whole grace period."""
    for signum, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, signum)
            if signum == signal.SIGTERM:
                os.killpg(pgid, signal.SIGCONT)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:  # reap the leader when it is our own child, so it does not linger as a zombie
                os.waitpid(pgid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not group_alive(pgid):
                return
            time.sleep(0.2)
