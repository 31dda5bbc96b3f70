"""What every test shares: each test leaves torch's thread count as it found it.

Benchmarks run in-process by their tests time one thread (``--threads 1``); a test that compares a child
process's outputs with this process's bit for bit (remote code, pipelines) needs both to add in the same
order, which the number of threads decides."""

import atexit
import os
import shutil
import tempfile

# Under pytest-xdist (`pytest -n N`) each worker runs one thread, as do the processes its tests start: N workers
# each with torch's default of one thread per core would spin on cores the others hold.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
# datasets' cache (read when datasets is imported) in a folder of this process's own, removed at its exit: not the
# user's ~/.cache, and no other worker's failed build walks through it
_DATASETS_CACHE = tempfile.mkdtemp(prefix="vt-tests-datasets-")
os.environ["HF_DATASETS_CACHE"] = _DATASETS_CACHE
atexit.register(shutil.rmtree, _DATASETS_CACHE, ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


# test_faults.py's data and its uninterrupted reference run (a subprocess of training/train.py, 8 s), shared by the
# modules that import its fixtures (test_preemption, test_run_lock, test_memory_check): made once a session. Their
# tests write each run into a folder of its own name there, or under their tmp_path.
@pytest.fixture(scope="session")
def fault_runs_folder(tmp_path_factory):
    import test_faults

    return test_faults.write_train_file(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="session")
def uninterrupted_fault_run(fault_runs_folder):
    import test_faults

    return test_faults.run_uninterrupted(fault_runs_folder)


# A GPU machine is lent for minutes and a call there may be cut by its timeout (docs/benchmarks/gpu.md), which loses
# --durations' table at the end: each gpu test that ran writes its seconds as it ends, so that a cut log still says
# where the time went.
_gpu_seconds: dict = {}  # test id -> {phase: seconds}, for the tests marked gpu


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None:
        _gpu_seconds[item.nodeid] = {}


def pytest_runtest_logreport(report):
    import sys

    spent = _gpu_seconds.get(report.nodeid)
    if spent is None:
        return
    if report.when == "setup" and report.skipped:  # no GPU: nothing ran
        del _gpu_seconds[report.nodeid]
        return
    spent[report.when] = report.duration
    if report.when == "teardown":  # a fixture that failed at its setup, after minutes, too
        phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in spent.items())
        sys.stderr.write(f"\n[gpu] {report.nodeid}: {sum(spent.values()):.1f} s ({phases})\n")
