"""Continuous batching with chunked prefill, speculative look-ahead and preemption.

Every step, each scheduled sequence feeds the target the committed tokens it has no KV for yet
(``token_ids[num_computed_tokens:]``, cut to the token budget). A sequence whose feed reaches its
last token also runs a decoding round: ``k`` proposals are appended and the target scores
``[r, s_1..s_k]`` (k = 0 is plain AR). Prefill, resumption after preemption and decoding are the
same operation, so sequences join and leave the batch independently.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from saguaro.core.sequence import Sequence, Status
from saguaro.engine.block_manager import BlockManager


@dataclass
class Scheduled:
    seq: Sequence
    num_new_tokens: int  # committed tokens fed this step
    decode: bool  # the feed reaches the last token: run a round this step
    k: int  # proposals this round (0 for AR, or when near a length limit)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        lookahead: int,
        on_preempt: Callable[[Sequence], None] | None = None,
    ) -> None:
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.lookahead = lookahead
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.on_preempt = on_preempt  # told of every preemption (a proposer's draft KV goes too)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _plan(self, seq: Sequence, budget: int) -> tuple[int, bool, int]:
        remaining = len(seq) - seq.num_computed_tokens
        n = min(remaining, budget)
        if n < remaining:
            return n, False, 0
        # k proposals commit up to k + 1 tokens: never past max_tokens or max_model_len, so a
        # sequence near either limit shrinks its round instead of waiting for room forever.
        k = min(
            self.lookahead,
            seq.params.max_tokens - seq.num_output_tokens - 1,
            self.max_model_len - len(seq),
            budget - n,
        )
        return n, True, max(k, 0)

    def schedule(self) -> list[Scheduled]:
        budget = self.max_num_batched_tokens
        out: list[Scheduled] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n, decode, k = self._plan(seq, budget)
            need = seq.num_computed_tokens + n + k
            while not self.bm.can_allocate(seq, need):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break
            self.bm.allocate(seq, need)
            out.append(Scheduled(seq, n, decode, k))
            budget -= n + k
            i += 1
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            if not seq.block_table:
                seq.num_cached_tokens = self.bm.admit(seq)
                seq.num_computed_tokens = seq.num_cached_tokens
            n, decode, k = self._plan(seq, budget)
            need = seq.num_computed_tokens + n + k
            if not self.bm.can_allocate(seq, need):
                self.bm.free_all(seq)
                seq.num_computed_tokens = 0
                break
            self.bm.allocate(seq, need)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.append(Scheduled(seq, n, decode, k))
            budget -= n + k
        return out

    def _preempt(self, seq: Sequence) -> None:
        """Free a sequence's KV and requeue it at the front. Its tokens (prompt and everything
        generated so far) are kept and recomputed on readmission, helped by the prefix cache."""
        self.running.remove(seq)
        self.bm.free_all(seq)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        if self.on_preempt is not None:
            self.on_preempt(seq)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.bm.free_all(seq)
