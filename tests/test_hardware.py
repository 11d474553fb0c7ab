"""The machine's CPU load: one sampler for every thread, measured over a real interval (psutil's
`cpu_percent(interval=None)` keeps a baseline per thread and reads 0.0 on a thread's first call —
the Hardware tab showed 0.0% while the Train tab showed 100%)."""
from __future__ import annotations

import subprocess
import sys
import threading
from collections import namedtuple

from trainer_core.base.hardware import CpuLoad, busy_pct, cpu_load, machine_reading

Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")


def _t(user: float, idle: float, iowait: float = 0.0, guest: float = 0.0) -> Times:
    return Times(user, 0.0, 0.0, idle, iowait, 0.0, 0.0, 0.0, guest, 0.0)


class FakeClock:
    """cpu_times() and monotonic() that move only when the sampler waits (or the test says so)."""

    def __init__(self, steps: list[Times]):
        self.now, self.steps, self.waits = 100.0, list(steps), []

    def times(self) -> Times:
        return self.steps.pop(0)

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def test_busy_pct_counts_idle_and_iowait_as_not_busy_and_guest_once():
    assert busy_pct(_t(0, 0), _t(30, 70)) == 30.0
    assert busy_pct(_t(0, 0), _t(50, 25, iowait=25)) == 50.0
    assert busy_pct(_t(0, 0), _t(50, 50, guest=40)) == 50.0        # guest time is already in user
    assert busy_pct(_t(5, 5), _t(5, 5)) == 0.0                      # no time passed: not a division by zero


def test_the_first_reading_measures_over_a_window_not_a_zero():
    fake = FakeClock([_t(0, 0), _t(60, 40), _t(60, 140), _t(160, 140)])
    load = CpuLoad(window=0.3, times=fake.times, clock=fake.clock, wait=fake.wait)
    assert load.read() == 60.0 and fake.waits == [0.3]              # measured, over the window
    fake.now += 3.0
    assert load.read() == 0.0                                       # since the previous reading: idle
    fake.now += 3.0
    assert load.read() == 100.0 and fake.waits == [0.3]             # no further wait between readings


def test_readings_too_close_together_repeat_the_last_and_a_stale_one_measures_again():
    fake = FakeClock([_t(0, 0), _t(25, 75), _t(25, 75), _t(125, 75)])
    load = CpuLoad(window=0.3, stale_s=30.0, min_gap_s=0.1, times=fake.times, clock=fake.clock, wait=fake.wait)
    assert load.read() == 25.0
    fake.now += 0.01
    assert load.read() == 25.0 and len(fake.steps) == 2             # no new cpu_times() read
    fake.now += 60.0                                                # long idle gap: a fresh window
    assert load.read() == 100.0 and fake.waits == [0.3, 0.3]


def test_a_busy_machine_reads_busy_from_any_thread_on_its_first_call():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        results: list[float] = []
        load = CpuLoad(window=0.5)
        for _ in range(2):          # each call on a new thread: psutil's per-thread baseline read 0.0 here
            worker = threading.Thread(target=lambda: results.append(load.read()))
            worker.start()
            worker.join()
        assert results[0] > 0.0
        assert cpu_load() > 0.0 and machine_reading(None, with_gpus=False)["cpu_pct"] > 0.0
    finally:
        busy.kill()
        busy.wait()
