"""Serve a single-threaded ``LLMEngine`` to asyncio code from one background thread.

Every call into the engine (add, step, abort) happens on the loop thread. Request handlers talk
to it only through a command list guarded by a condition variable, and receive outputs on a
per-request ``asyncio.Queue`` fed with ``call_soon_threadsafe``. With nothing to run the thread
blocks on the condition, so an idle server uses no CPU.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from saguaro.core.sequence import Sequence
from saguaro.engine.engine import LLMEngine
from saguaro.errors import SaguaroError
from saguaro.sampling import SamplingParams
from saguaro.sampling.logprobs import TokenLogprob

log = logging.getLogger("saguaro.server")

ENGINE_FAILURE = "the engine failed while serving this request"
DRAIN_POLL_S = 0.05  # how often a draining server checks whether its requests have finished


class ShuttingDown(Exception):
    """The server is draining: it finishes what it has and takes nothing new."""


LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass
class StreamEvent:
    """What one request gained in one engine step (several tokens under speculation)."""

    text: str  # text safe to show, new since the previous event
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None  # "stop" | "length" | "abort" on the last event
    error: str | None = None  # the engine failed; also the last event
    # the log-probabilities of the tokens committed since the previous event, if asked for
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # the prompt's (first: None), on the request's first event, if asked for
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket; the last one is +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass
class EngineStats:
    """Totals over the server's life, written by the loop thread, read by ``/metrics``."""

    accepted_length: Histogram  # tokens committed per decoding round (1 + accepted)
    finished: Counter[str] = field(default_factory=Counter)  # requests by finish reason
    rounds: Counter[tuple[str, int]] = field(default_factory=Counter)  # by (mode, proposals)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    ssd_rounds: int = 0
    ssd_hits: int = 0
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    ttft: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))

    def record(self, seq: Sequence, reason: str, now: float) -> None:
        self.finished[reason] += 1
        self.prompt_tokens += seq.num_prompt_tokens
        self.generation_tokens += seq.num_output_tokens
        end = seq.finish_time or now
        self.latency.observe(end - seq.arrival_time)
        if seq.first_token_time is not None:
            self.ttft.observe(seq.first_token_time - seq.arrival_time)
            if seq.num_output_tokens > 1:
                self.tpot.observe((end - seq.first_token_time) / (seq.num_output_tokens - 1))
        for r in seq.records:
            self.rounds[r.mode, r.num_drafted] += 1
            self.accepted_length.observe(1 + r.num_accepted)
            self.drafted_tokens += r.num_drafted
            self.accepted_tokens += r.num_accepted
            if r.hit is not None:
                self.ssd_rounds += 1
                self.ssd_hits += r.hit


class RequestStream:
    """One sample of a submitted request: iterate it for ``StreamEvent``s; ``cancel()`` aborts
    it."""

    def __init__(self, owner: AsyncEngine, prompt_ids: list[int], params: SamplingParams):
        self.owner = owner
        self.prompt_ids = prompt_ids
        self.params = params  # the request's (n samples)
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.seq_id: int | None = None  # set on the loop thread once the engine has it
        self.done = False

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        while not self.done:
            event = await self.queue.get()
            self.done = event.final
            yield event

    def cancel(self) -> None:
        if not self.done:
            self.owner._post(("abort", [self]))


@dataclass
class _Active:
    stream: RequestStream
    seq: Sequence
    sent: int = 0  # characters of text already delivered
    sent_logprobs: int = 0  # log-probabilities already delivered
    sent_prompt: bool = False  # the prompt's log-probabilities went out

    def fill(self, event: StreamEvent) -> StreamEvent:
        """``event`` with the log-probabilities not delivered yet."""
        logprobs = self.seq.logprobs or []
        event.logprobs, self.sent_logprobs = logprobs[self.sent_logprobs :], len(logprobs)
        if not self.sent_prompt and self.seq.prompt_logprobs is not None:
            event.prompt_logprobs, self.sent_prompt = list(self.seq.prompt_logprobs), True
        return event


def _put_all(items: list[tuple[RequestStream, StreamEvent]]) -> None:
    for stream, event in items:
        stream.queue.put_nowait(event)


class AtCapacity(Exception):
    """More requests would wait for a place in the running batch than the server allows."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_waiting: int | None = None) -> None:
        self.engine = engine
        # Requests that may wait beyond the max_num_seqs the engine runs at once (None: any).
        self.max_waiting = max_waiting
        self.stats = EngineStats(Histogram(tuple(range(1, engine.cfg.lookahead + 2))))
        self.stats_lock = threading.Lock()
        self._cond = threading.Condition()
        self._commands: list[tuple[str, list[RequestStream]]] = []
        self._thread: threading.Thread | None = None
        self.accepting = True  # False once draining: submit() refuses new requests
        # Loop-thread state.
        self._active: dict[int, _Active] = {}  # by seq_id
        self._outbox: list[tuple[RequestStream, StreamEvent]] = []

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="saguaro-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Abort whatever is in flight and join the loop thread (the engine stays usable)."""
        if self._thread is not None:
            self._post(("stop", []))
            self._thread.join()
            self._thread = None

    def drain(self, grace_s: float) -> None:
        """Take nothing new; give the requests in flight ``grace_s`` seconds to finish, then end
        the rest (each stream gets a final event with finish_reason "abort"). Thread-safe."""
        self.accepting = False
        deadline = time.monotonic() + grace_s
        while self.running and time.monotonic() < deadline:
            with self._cond:
                busy = bool(self._commands) or self.engine.has_unfinished()
            if not busy:
                return
            time.sleep(DRAIN_POLL_S)
        self._post(("abort_all", []))

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> list[RequestStream]:
        """Queue a validated prompt (see ``LLMEngine.encode_prompt``): one stream per sample
        (``params.n``). Call from the event loop."""
        if not self.accepting:
            raise ShuttingDown("the server is shutting down")
        # An idle server takes any request (a large n included): only a crowd is turned away.
        busy = self.in_flight()
        waiting = busy + params.n - self.engine.cfg.max_num_seqs
        if self.max_waiting is not None and busy and waiting > self.max_waiting:
            raise AtCapacity(
                f"the server is at capacity: {self.engine.cfg.max_num_seqs} requests run and "
                f"{self.max_waiting} may wait; retry later"
            )
        streams = [RequestStream(self, prompt_ids, params) for _ in range(params.n)]
        self._post(("add", streams))
        return streams

    def in_flight(self) -> int:
        """Requests submitted and not yet finished (samples count one each). Thread-safe."""
        with self._cond:
            queued = sum(len(streams) for kind, streams in self._commands if kind == "add")
        return queued + len(self._active)

    def _post(self, command: tuple[str, list[RequestStream]]) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify()

    # ---- the loop thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._commands and not self.engine.has_unfinished():
                    self._cond.wait()
                commands, self._commands = self._commands, []
            for kind, streams in commands:
                if kind in ("stop", "abort_all"):
                    for active in list(self._active.values()):
                        self._abort(active)
                    if kind == "stop":
                        self._flush()
                        return
                    continue
                if kind == "add":
                    self._add(streams)
                    continue
                for stream in streams:  # abort; a finished request has left
                    if stream.seq_id in self._active:
                        self._abort(self._active[stream.seq_id])
            if self.engine.has_unfinished():
                self._step()
            self._flush()

    def _flush(self) -> None:
        """Hand this iteration's events over: one wake-up per event loop, not per request."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, StreamEvent]]] = {}
        for stream, event in self._outbox:
            by_loop.setdefault(stream.loop, []).append((stream, event))
        self._outbox = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop has closed: nobody is listening
                pass

    def _add(self, streams: list[RequestStream]) -> None:
        first = streams[0]
        try:
            seqs = self.engine.add_samples(first.prompt_ids, first.params)
        except Exception as e:  # fail this request, never the loop thread
            log.exception("cannot add request")
            why = str(e) if isinstance(e, SaguaroError) else ENGINE_FAILURE
            for stream in streams:
                event = StreamEvent("", len(stream.prompt_ids), 0, error=why)
                self._outbox.append((stream, event))
            return
        for stream, seq in zip(streams, seqs, strict=True):
            stream.seq_id = seq.seq_id
            self._active[seq.seq_id] = _Active(stream, seq)

    def _step(self) -> None:
        try:
            seqs = self.engine.step()
        except Exception:  # a failed step must not take the server down with it
            log.exception("engine step failed; failing %d requests", len(self._active))
            for active in list(self._active.values()):
                seq = active.seq
                self.engine.abort(seq.seq_id)
                event = StreamEvent("", seq.num_prompt_tokens, seq.num_output_tokens)
                event.error = ENGINE_FAILURE  # the traceback goes to the log, not the client
                self._finish(active, event)
            return
        for seq in seqs:
            active = self._active.get(seq.seq_id)
            if active is None:
                continue
            # Everything committed this step goes out in one event: no per-token lag.
            text = self.engine.stream_text(seq)
            delta = text[active.sent :]
            active.sent = max(active.sent, len(text))
            event = active.fill(StreamEvent(delta, seq.num_prompt_tokens, seq.num_output_tokens))
            if seq.is_finished:
                if seq.error is not None:  # this request alone failed
                    event.error = seq.error
                else:
                    event.finish_reason = seq.finish_reason
                self._finish(active, event)
            elif delta or event.logprobs:
                self._outbox.append((active.stream, event))

    def _abort(self, active: _Active) -> None:
        seq = active.seq
        self.engine.abort(seq.seq_id)
        self._finish(active, StreamEvent("", seq.num_prompt_tokens, seq.num_output_tokens, "abort"))

    def _finish(self, active: _Active, event: StreamEvent) -> None:
        del self._active[active.seq.seq_id]
        with self.stats_lock:
            self.stats.record(active.seq, event.finish_reason or "error", time.perf_counter())
        self._outbox.append((active.stream, event))
