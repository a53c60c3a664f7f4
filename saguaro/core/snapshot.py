"""A read-only view of an engine's state, for the server's metrics and the bench."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepTimes:
    """Seconds an engine spent in its steps, over its life: the whole of each step, and the
    parts spent proposing (the draft, or a strategy's choice) and in the target's forward. What
    is left of ``step_s`` is the engine's own work (scheduling, verifying, committing)."""

    step_s: float = 0.0
    propose_s: float = 0.0
    forward_s: float = 0.0


@dataclass(frozen=True)
class EngineSnapshot:
    mode: str  # ar | sd | ssd
    lookahead: int  # token slots a round may write past the committed length (K, 0 for AR)
    num_steps: int
    running: int  # sequences in the batch
    waiting: int  # sequences queued
    sequences: int  # unfinished requests the engine holds
    num_preemptions: int
    kv_blocks_total: int
    kv_blocks_free: int
    prefix_hit_tokens: int  # prompt tokens served from the prefix cache, over the engine's life
    draft_state: str  # none | running | restarting | failed
    draft_restarts: int
    draft_failure: str | None
    tensor_parallel_size: int = 1
    failure: str | None = None  # the engine cannot step any more (a tensor-parallel rank failed)
    times: StepTimes = field(default_factory=StepTimes)  # a copy of the engine's
