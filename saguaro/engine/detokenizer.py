"""Incremental detokenization and stop conditions, one committed token at a time."""

from __future__ import annotations

from dataclasses import dataclass

from saguaro.core.sequence import Sequence, Status
from saguaro.models.tokenizer import Tokenizer

# Tokens of prompt context decoded with the first output token (merges across the boundary).
_CONTEXT = 4


@dataclass
class DetokState:
    prefix_offset: int
    read_offset: int


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[int, DetokState] = {}

    def start(self, seq: Sequence) -> None:
        n = seq.num_prompt_tokens
        self.states[seq.seq_id] = DetokState(max(n - _CONTEXT, 0), n)

    def drop(self, seq: Sequence) -> None:
        self.states.pop(seq.seq_id, None)

    def append_token(self, seq: Sequence, max_model_len: int) -> None:
        """Account for ``seq``'s newest token: extend ``seq.text`` and finish it if a stop
        condition holds. Text of a trailing incomplete UTF-8 sequence is held back until the
        bytes complete it."""
        st = self.states[seq.seq_id]
        token = seq.token_ids[-1]
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in seq.eos_token_ids):
            self._finish(seq, "stop", token)
            return
        dec = self.tokenizer.decode
        prefix = dec(seq.token_ids[st.prefix_offset : st.read_offset])
        full = dec(seq.token_ids[st.prefix_offset :])
        if not full.endswith("\ufffd") and len(full) > len(prefix):
            start = max(len(seq.text) - _max_len(params.stop) + 1, 0)
            seq.text += full[len(prefix) :]
            st.prefix_offset, st.read_offset = st.read_offset, len(seq.token_ids)
            # min_tokens holds stop strings back too: one completed before it never stops.
            stops = params.stop if seq.num_output_tokens >= params.min_tokens else []
            for s in stops:
                idx = seq.text.find(s, start)
                if idx != -1:
                    seq.text = seq.text[:idx]
                    self._finish(seq, "stop", s)
                    return
        if seq.num_output_tokens >= params.max_tokens or len(seq) >= max_model_len:
            self._finish(seq, "length", None)

    def _finish(self, seq: Sequence, reason: str, stop_reason: str | int | None) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason

    def stream_text(self, seq: Sequence) -> str:
        """Text safe to stream: withholds a tail that may still grow into a stop string."""
        if seq.is_finished or not seq.params.stop:
            return seq.text
        hold = 0
        for s in seq.params.stop:
            for n in range(min(len(s) - 1, len(seq.text)), 0, -1):
                if seq.text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        return seq.text[: len(seq.text) - hold]


def _max_len(stops: list[str]) -> int:
    return max((len(s) for s in stops), default=1)
