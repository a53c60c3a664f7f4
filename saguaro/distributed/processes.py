"""Child processes that must never outlive their purpose."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

# A child asked to exit (or terminated) gets this long before SIGKILL.
SHUTDOWN_GRACE_S = 5.0


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
