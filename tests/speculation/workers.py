"""An in-process draft worker for the worker and cache-builder tests."""

from __future__ import annotations

from saguaro.config import EngineConfig
from saguaro.speculation import protocol as P
from saguaro.speculation.worker import DraftWorker


def make_worker(draft_dir, k, fanout, **kw) -> DraftWorker:
    """A worker on CPU, context 256, up to 4 sequences; ``kw`` overrides WorkerConfig fields.
    Its chains are the draft's own (no copies from the context, no confidence stop) unless
    ``kw`` sets ``lookup`` or ``stop_below``."""
    engine = EngineConfig(
        num_speculative_tokens=k,
        fanout=fanout,
        saguaro_c=1.0,
        draft_top_m=64,
        max_num_seqs=4,
        block_size=16,
        dtype="float32",
        # dense, as the same checkpoint served as a target, which tests compare the worker to
        draft_quantization="none",
        device="cpu",
        seed=0,
        pin_cpus=False,
        draft_lookup=0,
        draft_stop_below=0,
    )
    cfg = P.WorkerConfig.from_engine(engine, draft_dir, max_model_len=256)
    for key, value in kw.items():
        setattr(cfg, key, value)
    return DraftWorker(cfg)
