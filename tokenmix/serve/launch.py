"""``tokenmix serve`` in a child process on a free local port: what ``bench --kinds serve`` and the tests drive."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

STARTUP_SECONDS = 300  # the server measures its state sizes before it listens


class ServerProcess:
    """``tokenmix serve SERVED --port 0 FLAGS...``; ``url`` once it listens, ``lines`` what it printed."""

    def __init__(self, served, *flags: str):
        command = [sys.executable, "-m", "tokenmix.cli", "serve", str(served), "--port", "0", *flags]
        # its own process group: ``stop`` ends the engine process with it, which else holds the pipe open for seconds
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[str] = []
        listening = threading.Event()
        self.reader = threading.Thread(target=self._read, args=(listening,), daemon=True)
        self.reader.start()
        if not listening.wait(STARTUP_SECONDS) or self.process.poll() is not None:
            self.stop()
            raise RuntimeError("tokenmix serve did not start: " + " | ".join(self.lines[-5:]))
        self.url = re.search(r"http://\S+", next(line for line in self.lines if "listening on" in line)).group(0)

    def _read(self, listening: threading.Event) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip())
            if "listening on" in line:
                listening.set()
        listening.set()  # it exited: the waiter finds out

    def stop(self) -> int:
        """Kill it and its engine process if it still runs; its exit status (``lines`` then holds all it printed)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        status = self.process.wait(30)
        self.reader.join(30)
        return status

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
