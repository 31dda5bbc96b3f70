"""One run per output folder: a lock file naming the run that holds it.

Two runs started on one ``--output_dir`` (a job submitted twice, a typo) would both write checkpoints
into it, and resuming would then pick from a mixture. `hold_output_dir` takes ``OUTPUT_DIR/_run.lock``
when a run starts and removes it when the run ends, however it ends; a second run is refused at once,
before any data is read, with one line naming the running one (`OutputDirInUse`).

The lock is an ``fcntl.flock`` on the file, which the kernel drops when its process dies, however it
dies; the file's content (host, process id, start time) is for the people reading the error. A file
left by a process that died without removing it (kill -9) is found unlocked and taken over with a
warning. A file written on another host is not taken over while that run may be alive: this host cannot
check its process, and network file systems may not pass locks between hosts. So the run holding the lock
touches the file every `HEARTBEAT_SECONDS`; a file from another host untouched for `STALE_SECONDS` is of a
run that is gone (killed past its grace time, its node lost: a requeued job lands on another node) and is
taken over with a warning. Before that, the error names the host, the file, and when it goes stale. On a
file system that takes no locks (a warning says so), the file alone decides: a run is refused while the
process it names lives.

Under ``accelerate launch`` only the main process locks; the others wait for its outcome (a
broadcast) and are refused with it, so no process starts reading data while another is refused.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

LOCK_FILE = "_run.lock"  # "_*": what the Trainer's push_to_hub leaves out, like checkpointing's STAGING_DIR
HEARTBEAT_SECONDS = 60.0  # how often the run holding the lock touches its file
STALE_SECONDS = 900.0  # a lock file of another host untouched this long: its run is gone (clocks may differ)


class OutputDirInUse(ValueError):
    """Another run holds the output folder (a ValueError: bad input, refused before any work)."""


class RunLock:
    """The lock on one output folder; `acquire` takes it or raises `OutputDirInUse`, `release` gives it back."""

    def __init__(self, output_dir: str | Path):
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_FILE
        self._fd: int | None = None
        self._stop_beating: threading.Event | None = None
        self._created: list[Path] = []  # folders made for the lock, deepest first: removed with it if left empty

    def acquire(self) -> RunLock:
        folder = self.output_dir.absolute()
        while not folder.exists():
            self._created.append(folder)
            folder = folder.parent
        self.output_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd, locked = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644), True
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise OutputDirInUse(self._in_use(holder)) from None
            except OSError as error:  # a file system without locks (e.g. Lustre mounted without flock)
                locked = False
                logger.warning(
                    f"--output_dir {self.output_dir}: the file system takes no locks ({error.strerror}); "
                    "the lock file alone keeps a second run out while the first one's process lives"
                )
            if locked and not self._is_the_file(fd):  # released and removed between our open and our lock: again
                os.close(fd)
                continue
            break
        holder = _read(fd)
        if locked and "unreadable" in holder:  # cut short (a full disk, a crash mid-write), and no process holds it
            logger.warning(
                f"--output_dir {self.output_dir}: taking over a lock file that cannot be read "
                f"({holder['unreadable']}); no process holds its lock"
            )
            holder = {}
        if holder and holder.get("host") != socket.gethostname():
            untouched = time.time() - os.fstat(fd).st_mtime
            if untouched < STALE_SECONDS:  # (a lock taken says nothing of another host's on a network file system)
                os.close(fd)  # unlocks
                raise OutputDirInUse(self._held_elsewhere(holder, untouched))
            logger.warning(
                f"--output_dir {self.output_dir}: taking over the lock of a run on host {holder.get('host')} "
                f"({_describe(holder)}), untouched for {untouched / 60:.0f} minutes: that run is gone"
            )
            holder = {}
        if holder and not locked and _alive(holder.get("pid")):
            os.close(fd)
            raise OutputDirInUse(self._in_use(holder))
        if holder:
            alive = "still running but not holding it" if _alive(holder.get("pid")) else "no longer running"
            logger.warning(
                f"--output_dir {self.output_dir}: taking over the lock of process {holder.get('pid')} "
                f"(started {holder.get('started', '?')}), {alive}; its run ended without releasing it"
            )
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(_this_process()).encode())
        os.fsync(fd)
        self._fd = fd
        self._stop_beating = threading.Event()
        threading.Thread(target=self._beat, args=(self._stop_beating,), name="run lock", daemon=True).start()
        return self

    def _beat(self, stop: threading.Event) -> None:
        """Touch the file while the run holds it, so that another host can tell a live run from a gone one."""
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path)
            except OSError:  # gone or unreachable for a moment: the next beat tries again
                pass

    def release(self) -> None:
        """Remove the file, then unlock: a process that opened it meanwhile finds it gone and opens it anew.
        A folder made for the lock and still empty goes too (a run refused for bad input leaves nothing)."""
        if self._fd is None:
            return
        if self._stop_beating is not None:
            self._stop_beating.set()
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None
        for folder in self._created:
            try:
                folder.rmdir()
            except OSError:  # not empty: the run wrote into it
                break

    def _is_the_file(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _in_use(self, holder: dict) -> str:
        return (
            f"--output_dir {self.output_dir} is in use by another run ({_describe(holder)}): wait for it to end, "
            "or give another --output_dir."
        )

    def _held_elsewhere(self, holder: dict, untouched: float) -> str:
        stale = max(STALE_SECONDS - untouched, 0) / 60
        return (
            f"--output_dir {self.output_dir} is locked by a run on host {holder.get('host')} "
            f"({_describe(holder)}), which cannot be checked from {socket.gethostname()}: if that run has ended, "
            f"delete {self.path}, or run again in {stale:.0f} minutes, when the lock goes stale unless that run "
            "touches it; otherwise give another --output_dir."
        )


def hold_output_dir(training_args) -> RunLock | None:
    """Lock ``training_args.output_dir`` for this run: the main process takes the lock, every process learns
    the outcome; `OutputDirInUse` on every process when another run holds it. The lock (main process) or
    None (the others); release it with ``.release()`` when the run ends."""
    lock, refusal, failure = None, None, None
    if training_args.process_index == 0:
        try:
            lock = RunLock(training_args.output_dir).acquire()
        except OutputDirInUse as error:
            refusal = (OutputDirInUse, str(error))
        except OSError as error:  # e.g. no permission, or a file where a folder should be
            refusal = (OSError, f"--output_dir {training_args.output_dir}: {error}")
        except Exception as error:  # anything else: raised here as it is, and the others learn of it too
            failure = error
            refusal = (
                RuntimeError,
                f"--output_dir {training_args.output_dir}: the main process could not take the run lock "
                f"({type(error).__name__}: {error})",
            )
    import torch

    if training_args.world_size > 1 and torch.distributed.is_initialized():  # the others follow the main process
        outcome = [refusal]
        torch.distributed.broadcast_object_list(outcome, src=0)
        refusal = outcome[0]
    if failure is not None:
        raise failure
    if refusal is not None:
        kind, message = refusal
        raise kind(message)
    return lock


def _this_process() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime()),
    }


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    content = os.read(fd, 4096)
    try:
        holder = json.loads(content) if content.strip() else {}
    except ValueError:  # not JSON, or not even UTF-8
        holder = {"host": "?", "pid": "?", "started": "?", "unreadable": f"{content[:60]!r}"}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict) -> str:
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"


def _alive(pid) -> bool:
    """Whether process ``pid`` of this host exists (signal 0 checks without sending anything)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
