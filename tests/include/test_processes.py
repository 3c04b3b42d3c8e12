"""Stopping a process group, also one whose processes are stopped (a hung stream)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from include.processes import group_alive, stop_group

# Exits 0 on SIGTERM, as the stream does once its micro-batch is done.
GRACEFUL = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
            "print('up', flush=True); time.sleep(300)")


def test_a_stopped_group_still_stops_gracefully_and_at_once():
    process = subprocess.Popen([sys.executable, "-c", GRACEFUL], start_new_session=True, stdout=subprocess.PIPE)
    assert process.stdout.readline() == b"up\n"
    process.send_signal(signal.SIGSTOP)  # hung: it cannot act on anything but SIGKILL

    started = time.monotonic()
    stop_group(process.pid, grace_seconds=60)
    assert time.monotonic() - started < 10  # not the grace period, not SIGKILL
    assert process.wait(timeout=5) == 0 and not group_alive(process.pid)
