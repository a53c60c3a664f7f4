"""Exceptions raised by saguaro. Each names the problem and is raised before work starts.

:func:`run_command` is where a command meets them: an error a user can cause ends the command
with its message on one line of stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable


class SaguaroError(Exception):
    """Base class for saguaro errors."""


class ModelLoadError(SaguaroError):
    """A model or tokenizer directory is missing, incomplete, corrupt or unsupported."""


class IncompatibleModelsError(SaguaroError):
    """Draft and target cannot be paired (different vocabularies or tokenizers)."""


class RequestError(SaguaroError, ValueError):
    """A request cannot be served as given (empty prompt, prompt longer than max_model_len, ...)."""


class DraftWorkerError(SaguaroError):
    """The draft (the SSD worker, or any proposer) died, failed or stopped answering; the engine
    goes on decoding exactly without speculation."""


class TensorParallelError(SaguaroError):
    """A rank of a tensor-parallel target failed, exited or stopped answering: the target cannot
    compute without it, so the engine stops (every rank is stopped with it)."""


# What a user can cause: a setting out of range, a path or model that is not there, a file
# saguaro cannot read, an optional extra that is not installed. A bug is none of these and keeps
# its traceback.
USER_ERRORS: tuple[type[Exception], ...] = (
    SaguaroError,
    ValueError,
    NotImplementedError,
    OSError,
    ImportError,
)
EXIT_ERROR = 2  # as argparse exits on a usage error


def run_command(prog: str, command: Callable[[list[str]], int], argv: list[str]) -> int:
    """``command(argv)``'s exit code; an error a user can cause is printed as ``PROG: error:
    MESSAGE`` on stderr instead, and exits :data:`EXIT_ERROR`."""
    try:
        return command(argv)
    except USER_ERRORS as e:
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return EXIT_ERROR
