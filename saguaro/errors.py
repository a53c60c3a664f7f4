"""Exceptions raised by saguaro. Each names the problem and is raised before work starts."""


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
