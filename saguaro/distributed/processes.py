"""Child processes that must never outlive their purpose."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

# A child asked to exit (or terminated) gets this long before SIGKILL.
SHUTDOWN_GRACE_S = 5.0


def children(pid: int) -> list[int]:
    """Child processes of ``pid``, whichever of its threads started them."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def reap(proc: subprocess.Popen | None, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """End ``proc`` if it still runs: SIGTERM, then SIGKILL after ``grace_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def exit_now(code: int) -> None:
    """End this child process with ``code`` once its logs are flushed, skipping the interpreter's
    teardown: with torch loaded that takes about half a second, which the parent closing it
    waits for. Only for a child with nothing left to clean up (no children, no atexit duty)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
