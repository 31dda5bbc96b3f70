"""benchmarks/common.py, the parts the benchmark scripts share: alternating timing, the speed ratio, the machine's
load while a run trains, and a run in a child process that dies with its parent and reports its own death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, load_script

common = load_script("benchmarks/common.py")


def test_alternate_times_the_tasks_in_turn_after_untimed_warm_up_passes():
    calls, ticks = [], iter(range(100))

    def task(name):
        return lambda: calls.append(name) or len(calls)

    seconds, outputs = common.alternate(
        {"a": task("a"), "b": task("b")}, repeats=3, warmup=2, clock=lambda: next(ticks)
    )
    assert calls == ["a", "b"] * 5  # two untimed passes, then three timed ones, ABAB
    assert seconds == {"a": [1, 1, 1], "b": [1, 1, 1]}  # each pass between two reads of the clock
    assert outputs == {"a": 9, "b": 10}  # the last pass's


def test_speed_ratio_is_the_ratio_of_the_medians_with_the_range_of_the_pairs():
    ratio, low, high = common.speed_ratio([4.0, 6.0, 5.0], [2.0, 2.0, 4.0])
    assert ratio == pytest.approx(5.0 / 2.0)
    assert (low, high) == pytest.approx((1.25, 3.0))  # 5/4 and 6/2


def test_machine_load_is_other_processes_cpu_time_over_the_cpus_capacity():
    """Over 200 CPU-seconds of capacity the CPUs were busy for 180 and this run for 150: others took 30
    (15%); the hypervisor's other guests 10 (5%)."""
    before = {"own": 2.0, "busy": 1000.0, "steal": 7.0, "total": 5000.0}
    after = {"own": 152.0, "busy": 1180.0, "steal": 17.0, "total": 5200.0}
    load = common.machine_load(120.0, before, after, 110.0)
    assert load == pytest.approx(
        {"matmul_gflops_before": 120.0, "matmul_gflops_after": 110.0, "others_cpu_share": 0.15, "steal_share": 0.05}
    )
    assert common.machine_load(1.0, {"own": 0.0}, {"own": 1.0}, 1.0) == {
        "matmul_gflops_before": 1.0,
        "matmul_gflops_after": 1.0,
    }  # no CPU counters


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the per-CPU counters of a Linux kernel")
def test_cpu_seconds_count_this_process_within_the_cpus_it_may_use():
    """The CPUs it may use were busy at least while this process computed, and had no more than their
    capacity over the wall time: own <= busy (with the counters' 10 ms resolution) <= total."""
    started, first = time.perf_counter(), common.cpu_seconds()
    sum(i * i for i in range(3_000_000))
    second, wall = common.cpu_seconds(), time.perf_counter() - started
    own, busy, total = (second[key] - first[key] for key in ("own", "busy", "total"))
    # busy equals total when every CPU was busy (two test processes on 2 cores): sums of floats, within 10 ms
    assert own > 0 and 0.5 * own <= busy <= total + 0.01 <= 1.2 * wall * len(os.sched_getaffinity(0)) + 0.06
    assert second["steal"] >= first["steal"] >= 0


def test_the_multi30k_folder_is_reported_missing_not_an_error(tmp_path, capsys):
    assert common.multi30k_folder(tmp_path / "absent") is None
    assert str(tmp_path / "absent") in capsys.readouterr().out
    assert common.multi30k_folder(tmp_path) == tmp_path


CHILD_PARENT = """
import os, sys, time
from common import run_in_child

if __name__ == "__main__":
    run_in_child(*{"sleep": (time.sleep, 120), "exit": (os._exit, 3)}[sys.argv[1]])
"""


def run_in_child_from_a_script(tmp_path, mode: str) -> subprocess.Popen:
    """common.run_in_child called by a script of its own (spawn imports the module anew)."""
    script = tmp_path / "parent.py"
    script.write_text(CHILD_PARENT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "benchmarks")}
    return subprocess.Popen([sys.executable, str(script), mode], env=env, stderr=subprocess.PIPE, text=True)


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def running(pid: int) -> bool:
    """The process exists and is not a zombie (one that has stopped and waits only to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_run_s_child_process_dies_with_a_stopped_benchmark(tmp_path):
    """A stopped benchmark must not leave its training run behind, sharing the CPU with the next one."""
    parent = run_in_child_from_a_script(tmp_path, "sleep")
    deadline, children = time.time() + 60, []
    while not children and time.time() < deadline:  # the spawned child, not multiprocessing's resource tracker
        time.sleep(0.2)
        children = [
            pid for pid in children_of(parent.pid) if b"tracker_fd" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
    assert children, "the child never started"
    time.sleep(2)  # past its start-up, into the run
    parent.send_signal(signal.SIGKILL)  # nothing of the parent runs: no exit handler can stop the child
    parent.wait()
    deadline = time.time() + 30
    while running(children[0]) and time.time() < deadline:
        time.sleep(0.2)
    assert not running(children[0]), "the run's child process outlived its parent"


def test_a_child_that_dies_without_a_result_is_an_error_not_a_wait_forever(tmp_path):
    parent = run_in_child_from_a_script(tmp_path, "exit")
    _, error = parent.communicate(timeout=120)
    assert parent.returncode != 0 and "RuntimeError" in error and "died with exit code 3" in error, error
