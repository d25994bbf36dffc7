"""One writer per results folder: the lock a run holds on its ``output_dir`` while it writes.

:class:`FolderLock` is an exclusive ``flock`` on ``output_dir/.keyformer.lock``, taken without waiting: a
second run into the folder is refused in one line (:class:`FolderBusy`) naming the holder (pid, host, start
time, SLURM job), read from the lock file, which the holder fills once it holds the lock. The kernel drops
the lock when its holder dies (a kill, a crash, a node that reboots), so a dead run never leaves it locked.
A lock still held after its recorded holder is gone (a forked child that outlived it; a SLURM job that
finished) is taken over: the stale file is replaced by a new one (only the file the takeover found), and a
lock whose file was replaced under it is never trusted (the path and the held file must be the same file).
The file is removed when the run lets go.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from keyformer.run.results import slurm_job
from keyformer.run.validate import UserError

LOCK_NAME = ".keyformer.lock"

try:  # POSIX only: elsewhere the folder is not locked (documented in docs/results-contract.md)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


class FolderBusy(UserError, RuntimeError):
    """Another live run holds the folder (nothing was changed)."""


def holder_record() -> dict[str, Any]:
    """Who holds a lock: this process's pid, host, start time (UTC) and SLURM job id (or null)."""
    job = slurm_job()
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "slurm_job": job["job_id"] if job else None}


def describe(holder: dict[str, Any] | None) -> str:
    """``pid 123 on host, started 2026-..., SLURM job 45``, or what is known."""
    if not holder:
        return "a run that is starting (holder not yet recorded)"
    text = f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
    return text + (f", SLURM job {holder['slurm_job']}" if holder.get("slurm_job") else "")


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 4096).decode("utf-8") or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def holder_gone(holder: dict[str, Any] | None) -> bool:
    """True when the recorded holder has surely ended: a pid of this host that no longer runs, or a SLURM job
    that ``squeue`` no longer lists (when ``squeue`` is here to ask). Unknown means alive."""
    if not holder:
        return False
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    job = holder.get("slurm_job")
    if job and shutil.which("squeue"):
        try:
            out = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True,
                                 text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return False
        return out.returncode == 0 and not out.stdout.strip() or "Invalid job id" in out.stderr
    return False


class FolderLock:
    """``with FolderLock(output_dir):`` holds the folder (made if absent) or raises :class:`FolderBusy`."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> FolderLock:
        if fcntl is None or self.fd is not None:  # pragma: no cover
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                if holder_gone(holder):
                    self._drop_stale(fd)
                    os.close(fd)
                    continue
                os.close(fd)
                raise FolderBusy(f"output_dir {self.folder} is being written by another run "
                                 f"({describe(holder)}); nothing was changed. Wait for it to end, or choose "
                                 "another output_dir") from None
            except OSError as e:  # a filesystem without flock (ENOLCK): run unlocked, and say so
                os.close(fd)
                self.path.unlink(missing_ok=True)
                print(f"[keyformer] warning: cannot lock {self.path} ({e.strerror}); this run does not hold "
                      "its output_dir against a second one", file=sys.stderr, flush=True)
                return self
            if not self._same_file(fd):  # the file was replaced or removed between open and lock: retry
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(holder_record()) + "\n").encode())
            os.fsync(fd)
            self.fd = fd
            return self
        raise FolderBusy(f"output_dir {self.folder}: its lock file {self.path} keeps changing; nothing was "
                         "changed")

    def _same_file(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def _drop_stale(self, fd: int) -> None:
        """Remove the lock file of a holder that has ended, if it is still the one ``fd`` holds open."""
        if self._same_file(fd):
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def release(self) -> None:
        """Let go: the lock file is removed first (while held), so no one locks a file about to vanish."""
        if self.fd is None:
            return
        if self._same_file(self.fd):
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
