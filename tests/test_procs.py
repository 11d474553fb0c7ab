"""procs.wait_usage: what a finished process took, in figures a loaded machine does not inflate (its CPU time and
the time it sat ready without a core), which tests/test_plan.py holds the plan's seconds to."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer_core.base.procs import wait_usage

# 0.3 s of CPU, 0.3 s asleep, exit code 3
_CHILD = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"
          "time.sleep(0.3)\nraise SystemExit(3)\n")


def test_wait_usage_reaps_the_process_and_measures_its_cpu_and_its_wait_for_a_core():
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD])
    usage = wait_usage(proc)
    wall = time.monotonic() - started
    assert proc.returncode == 3 and proc.poll() == 3 and proc.wait() == 3       # Popen sees the exit wait4 reaped
    assert usage.peak_rss_bytes > 0 or not Path("/proc/self/status").exists()
    assert 0.28 <= usage.cpu_seconds < wall                                    # its CPU, never its sleep
    if not Path(f"/proc/{proc.pid}").exists() and Path("/proc/self/task").exists():
        assert 0 <= usage.queued_seconds <= usage.queued_all_seconds < wall
        # what is left of the wall once the wait for a core is taken out: its CPU and its sleep (and what this
        # process took to notice the exit), however loaded the machine is
        busy = wall - usage.queued_seconds
        assert usage.cpu_seconds + 0.29 <= busy <= usage.cpu_seconds + 0.3 + 1.0, (wall, usage)


def test_wait_usage_of_a_process_already_reaped_still_returns():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    proc.wait()
    usage = wait_usage(proc)
    assert proc.returncode == 2 and usage.cpu_seconds is None


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_the_peak_is_the_largest_process_of_the_family():
    child = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
             "'import time; b = bytearray(200 << 20); time.sleep(0.3)'])")
    usage = wait_usage(subprocess.Popen([sys.executable, "-c", child]))
    assert usage.peak_rss_bytes >= 200 << 20
