"""One writer per run directory: whatever writes a run (train, resume, finetune, distil) holds an
exclusive ``fcntl.flock`` on ``<run>/.writer.lock``; a second writer is refused at once, naming the
holder. The kernel drops the lock with its process, so a killed writer never blocks the next one.
Under torchrun the process of rank 0 holds it for the job."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from ..io.files import storage_fault
from .directory import check_run_folder

LOCK_FILE = ".writer.lock"


def torchrun_rank() -> int:
    """This process's rank in the job torchrun started (0 without torchrun), known before the process group exists."""
    return int(os.environ.get("RANK", "0"))


class RunLock:
    """The exclusive right to write the run in ``directory``; ``release`` (or leaving ``with``) gives it up."""

    def __init__(self, directory, command: str):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        check_run_folder(self.directory)  # a folder that cannot be made is the user's to fix
        self.created = not self.directory.exists()  # removed again by ``release`` if the run left it empty
        while True:  # a holder that released between our open and our lock unlinked the file we opened: lock the new one
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                handle = open(self.path, "a+b", buffering=0)  # unbuffered: nothing left to flush at close
            except OSError as error:
                raise storage_fault(self.path, error) from None
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(handle)
                handle.close()
                raise ValueError(
                    f"--out {str(self.directory)!r} is being written by another process ({holder}): one run has one writer. "
                    "Wait for it to end (or stop it), or choose another --out"
                ) from None
            if self.path.exists() and os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
            handle.close()
        self.handle = handle
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        with contextlib.suppress(OSError):  # who holds it is a courtesy: a full disk does not stop the lock
            handle.truncate(0)
            handle.write(json.dumps(holder).encode() + b"\n")

    def release(self) -> None:
        """Remove the lock file and give up the lock (at most once)."""
        if self.handle is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
            if self.created:
                self.directory.rmdir()  # only if empty: a run that never started leaves nothing behind
        self.handle.close()
        self.handle = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exception) -> None:
        self.release()


def _holder(handle) -> str:
    """Who holds the lock, as its file says (written right after it was taken: may be empty for an instant)."""
    handle.seek(0)
    try:
        holder = json.loads(handle.read() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        holder = {}
    if not isinstance(holder, dict) or "pid" not in holder:
        return "it is starting"
    return f"tokenmix {holder.get('command', '?')}, PID {holder['pid']} on host {holder.get('host', '?')}, since {holder.get('since', '?')}"
