"""One run per output folder (vanilla_transformer.training.run_lock): a second run on a folder in use is
refused at once, in one line naming the running one; a lock left by a killed process is taken over, one
written on another host is not; the lock goes with the run, however it ends. The reference for "the first
run's checkpoints are intact" is an uninterrupted run with the same seed and data (tests/test_faults.py)."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import REPO
from test_faults import (  # noqa: F401
    MAX_STEPS,
    SAVE_STEPS,
    assert_same_weights,
    data_dir,
    finish,
    run_argv,
    start,
    uninterrupted,
    wait_for_updates,
)
from vanilla_transformer.training import run as train
from vanilla_transformer.training import run_lock
from vanilla_transformer.training.checkpointing import check_resumable
from vanilla_transformer.training.run_lock import LOCK_FILE, OutputDirInUse, RunLock, hold_output_dir

HOLDER = textwrap.dedent("""
    import sys, time
    from vanilla_transformer.training.run_lock import RunLock
    RunLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(120)
""")


def test_a_second_lock_on_a_folder_in_use_is_refused_naming_host_and_pid(tmp_path):
    lock = RunLock(tmp_path).acquire()
    try:
        with pytest.raises(OutputDirInUse) as refused:
            RunLock(tmp_path).acquire()
        message = str(refused.value)
        assert f"--output_dir {tmp_path}" in message and len(message.splitlines()) == 1
        assert f"host {socket.gethostname()}, pid {os.getpid()}" in message
    finally:
        lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    RunLock(tmp_path).acquire().release()  # free again


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputDirInUse, match=f"pid {holder.pid},"):  # alive: refused
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid  # kill -9 leaves the file
    with caplog.at_level(logging.WARNING):
        lock = RunLock(tmp_path).acquire()
    assert f"taking over the lock of process {holder.pid}" in caplog.text and "no longer running" in caplog.text
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_lock_from_another_host_is_refused_naming_the_host_and_kept(tmp_path):
    written = json.dumps({"host": "node-17.cluster", "pid": 4242, "started": "2026-11-27 10:00:00 UTC"})
    (tmp_path / LOCK_FILE).write_text(written)
    with pytest.raises(OutputDirInUse) as refused:
        RunLock(tmp_path).acquire()
    message = str(refused.value)
    assert "host node-17.cluster" in message and "pid 4242" in message and str(tmp_path / LOCK_FILE) in message
    assert (tmp_path / LOCK_FILE).read_text() == written  # not taken over
    assert f"run again in {run_lock.STALE_SECONDS / 60:.0f} minutes, when the lock goes stale" in message


def test_a_lock_from_another_host_untouched_for_long_is_taken_over_with_a_warning(tmp_path, caplog):
    """A run killed past its grace time, or on a node that was lost, leaves its file; the job requeued on another
    node was refused until someone deleted it. A run holding the lock touches it (below): one untouched for
    longer is gone."""
    written = json.dumps({"host": "node-17.cluster", "pid": 4242, "started": "2026-11-27 10:00:00 UTC"})
    (tmp_path / LOCK_FILE).write_text(written)
    long_ago = time.time() - run_lock.STALE_SECONDS - 60
    os.utime(tmp_path / LOCK_FILE, (long_ago, long_ago))
    with caplog.at_level(logging.WARNING):
        lock = RunLock(tmp_path).acquire()
    try:
        assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == socket.gethostname()
        assert (
            "taking over the lock of a run on host node-17.cluster" in caplog.text and "that run is gone" in caplog.text
        )
    finally:
        lock.release()


def test_the_run_holding_the_lock_touches_it_until_it_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_SECONDS", 0.05)
    lock = RunLock(tmp_path).acquire()
    long_ago = time.time() - 3600
    os.utime(tmp_path / LOCK_FILE, (long_ago, long_ago))
    deadline = time.monotonic() + 30
    while (tmp_path / LOCK_FILE).stat().st_mtime < time.time() - 60 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / LOCK_FILE).stat().st_mtime > time.time() - 60  # touched again
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    time.sleep(0.2)
    assert not (tmp_path / LOCK_FILE).exists()  # the beat ended with the lock: it made no file anew


def test_a_lock_file_cut_short_that_no_process_holds_is_taken_over_with_a_warning(tmp_path, caplog):
    for damaged in (b'{"host": "', b'\xff\xfe{"host"'):  # a write stopped half-way; bytes that are not UTF-8
        (tmp_path / LOCK_FILE).write_bytes(damaged)
        with caplog.at_level(logging.WARNING):
            lock = RunLock(tmp_path).acquire()
        assert "taking over a lock file that cannot be read" in caplog.text
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
        lock.release()
        caplog.clear()


def test_the_lock_goes_with_a_run_that_fails(data_dir, tmp_path):
    output = tmp_path / "run"
    with pytest.raises((ValueError, OSError), match="--resume_from_checkpoint"):  # refused after the lock was taken
        train.main(run_argv(data_dir, output, "--resume_from_checkpoint", str(tmp_path / "nowhere")))
    assert not (output / LOCK_FILE).exists()


def test_a_second_run_on_a_folder_in_use_exits_2_in_one_line_and_the_first_finishes_intact(
    data_dir, uninterrupted, capsys
):
    output = data_dir / "locked"
    hold = data_dir / "locked.hold"  # the first run waits before its first update while the file is there
    hold.touch()
    first = start(data_dir, output, hold=hold)
    try:
        wait_for_updates(first, 0)
        began = time.monotonic()
        with pytest.raises(SystemExit) as exit_info:
            train.main(run_argv(data_dir, output, "--average_checkpoints", "3"), exit_on_bad_input=True)
        assert time.monotonic() - began < 30  # at once: no data read, no model built
        assert first.poll() is None, "the first run ended before the second was refused"
    finally:
        hold.unlink()
        code, _, err = finish(first)
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(error.splitlines()) == 1, error
    assert error.startswith("vanilla-transformer train: error:")
    assert f"--output_dir {output} is in use" in error and f"pid {first.pid}," in error
    assert code == 0, err[-3000:]
    assert not (output / LOCK_FILE).exists()
    names = sorted(p.name for p in output.glob("checkpoint-*"))
    assert names == sorted(p.name for p in uninterrupted.glob("checkpoint-*"))
    for checkpoint in output.glob("checkpoint-*"):
        check_resumable(checkpoint)
        assert_same_weights(checkpoint, uninterrupted / checkpoint.name)
    assert_same_weights(output, uninterrupted)


@pytest.mark.parametrize("process_index", [0, 1])
def test_a_folder_the_main_process_cannot_make_stops_every_process_with_its_reason(
    process_index, tmp_path, monkeypatch
):
    """Not only a lock held elsewhere: an output folder under a file fails on the main process, and the others,
    waiting in the broadcast, learn why and stop too (they had waited there until the launcher killed them)."""
    import torch

    (tmp_path / "file").write_text("not a folder")
    output = tmp_path / "file" / "run"
    args = type("Args", (), {"process_index": process_index, "world_size": 2, "output_dir": str(output)})()
    sent = []

    def broadcast(outcome, src):
        if process_index == 0:
            sent.append(outcome[0])
        else:  # what the main process sent
            outcome[0] = (OSError, f"--output_dir {output}: [Errno 20] Not a directory: '{output}'")

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "broadcast_object_list", broadcast)
    with pytest.raises(OSError, match=f"--output_dir {output}: .*Not a directory"):
        hold_output_dir(args)
    if process_index == 0:
        assert sent[0][0] is OSError and "Not a directory" in sent[0][1]


def test_any_other_failure_of_the_main_process_reaches_the_others_too(tmp_path, monkeypatch):
    """Only OutputDirInUse and OSError were sent: any other error on the main process skipped the broadcast,
    and the other processes waited in it until the launcher killed them."""
    import torch

    def broken(self):
        raise KeyError("host")

    monkeypatch.setattr(RunLock, "acquire", broken)
    args = type("Args", (), {"process_index": 0, "world_size": 2, "output_dir": str(tmp_path / "run")})()
    sent = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "broadcast_object_list", lambda outcome, src: sent.append(outcome[0]))
    with pytest.raises(KeyError, match="host"):  # the main process: its own error, with its traceback
        hold_output_dir(args)
    assert sent[0][0] is RuntimeError and "could not take the run lock (KeyError: 'host')" in sent[0][1]


@pytest.mark.slow
def test_every_process_of_a_launch_is_refused_when_the_main_one_is(data_dir, tmp_path):
    """Under accelerate launch only the main process locks; the other one learns its outcome and exits too
    (rather than waiting for it forever at the first barrier)."""
    output = tmp_path / "run"
    lock = RunLock(output).acquire()
    try:
        command = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(REPO / "vanilla_transformer/training/accelerate_configs/ddp.yaml"),
            "--num_processes",
            "2",
            "-m",
            "vanilla_transformer.cli",
            "train",
            *run_argv(data_dir, output),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    finally:
        lock.release()
    refusals = [line for line in completed.stderr.splitlines() if "is in use by another run" in line]
    assert completed.returncode != 0 and len(refusals) == 2, completed.stderr[-3000:]
    assert all(f"pid {os.getpid()}," in line for line in refusals)
    assert not list(output.glob("checkpoint-*"))


def test_a_folder_made_for_the_lock_goes_with_it_when_nothing_was_written(tmp_path):
    RunLock(tmp_path / "new" / "run").acquire().release()
    assert not (tmp_path / "new").exists()
    lock = RunLock(tmp_path / "kept").acquire()
    (tmp_path / "kept" / "trainer_state.json").write_text("{}")
    lock.release()
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["trainer_state.json"]


def test_on_a_file_system_without_locks_the_file_alone_refuses_a_live_run(tmp_path, monkeypatch, caplog):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING):
        lock = RunLock(tmp_path).acquire()
    assert "takes no locks (No locks available)" in caplog.text
    with pytest.raises(OutputDirInUse, match=f"pid {os.getpid()},"):  # this process is alive
        RunLock(tmp_path).acquire()
    lock.release()
    RunLock(tmp_path).acquire().release()
