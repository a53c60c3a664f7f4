"""Batch-size-aware choice of backup on a cache miss (docs/design.md §7): neural or fast."""

from __future__ import annotations

from dataclasses import dataclass, field

BACKUP_KINDS = ("neural", "fast")
BACKUP_MODES = ("auto", *BACKUP_KINDS)

# Priors, replaced by the online estimates as rounds come in (see BackupPolicy).
PRIOR_P_HIT = 0.5  # no reason to favour hits or misses before the first round
PRIOR_ACCEPT = 0.7  # per-token acceptance behind the E_hit and neural E_miss priors
PRIOR_E_MISS_FAST = 1.3  # after prompt lookup a round commits little beyond the target's token
PRIOR_T_P = 1.0  # a primary speculation costs about a verification
PRIOR_T_B = {"neural": 1.0, "fast": 0.05}  # a neural backup is a speculation; n-grams are free
EMA_ALPHA = 0.05  # weight of the newest observation in every estimate


def predicted_speedup(
    p_hit: float,
    e_hit: float,
    e_miss: float,
    batch: int,
    t_p: float,
    t_b: float,
    t_o: float = 0.0,
) -> float:
    """Predicted SSD speedup over autoregressive decoding, times relative to one verification:

    `speedup = (p_hit E_hit + (1 - p_hit) E_miss)
               / (p_hit^b max(1 + T_o, T_p) + (1 - p_hit^b)(1 + T_o + T_b))`

    Derivation: each sequence commits E_hit tokens in a round when its outcome was cached and
    E_miss when it was not, so p_hit E_hit + (1 - p_hit) E_miss on average. A round lasts one
    verification when all b sequences hit (chance p_hit^b), unless the draft's primary
    speculation, which runs alongside it, takes longer (max(1, T_p)); if any sequence misses, the
    whole batch waits for the backup after verifying (1 + T_b). AR commits one token per
    verification-length step, so the long-run token rate ratio is expected tokens per round over
    expected round time (renewal-reward).

    T_o, beyond docs/design.md §7 (which sets it to 0): the target's own cost per round outside its
    forward (scheduling, sampling, verification bookkeeping). The draft's speculation overlaps
    it as well as the forward; a backup waits for both. Every round pays it whatever it
    commits, so the larger it is, the more it favours the backup that commits more per round.
    """
    all_hit = p_hit**batch
    tokens = p_hit * e_hit + (1.0 - p_hit) * e_miss
    return tokens / (all_hit * max(1.0 + t_o, t_p) + (1.0 - all_hit) * (1.0 + t_o + t_b))


@dataclass
class BackupPolicy:
    """Chooses ``neural`` or ``fast`` for the sequences of a batch that missed the cache.

    ``mode`` ``neural`` or ``fast`` forces that kind; ``auto`` takes the kind with the larger
    predicted speedup from online estimates. Every estimate is an exponential moving average with
    weight ``alpha`` on the newest observation, started from priors: p_hit ``PRIOR_P_HIT``; E_hit
    and neural E_miss the expected committed tokens `1 + a (1 - a^K) / (1 - a)` of a capped
    geometric with a = ``prior_accept`` (a neural backup speculates as well as a primary one);
    fast E_miss ``PRIOR_E_MISS_FAST``; T_p ``PRIOR_T_P`` and T_b ``PRIOR_T_B`` per kind; T_o 0.
    The E_miss of a kind moves only while that kind is in use.
    """

    mode: str = "auto"
    K: int = 4  # speculated tokens per round; sets the E_hit prior
    alpha: float = EMA_ALPHA
    prior_accept: float = PRIOR_ACCEPT
    p_hit: float = field(init=False, default=PRIOR_P_HIT)
    e_hit: float = field(init=False)
    e_miss: dict[str, float] = field(init=False)
    t_p: float = field(init=False, default=PRIOR_T_P)
    t_b: dict[str, float] = field(init=False)
    t_o: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.mode not in BACKUP_MODES:
            raise ValueError(f"unknown backup mode {self.mode!r}; expected one of {BACKUP_MODES}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        a = self.prior_accept
        self.e_hit = 1.0 + a * (1.0 - a**self.K) / (1.0 - a)
        self.e_miss = {"neural": self.e_hit, "fast": PRIOR_E_MISS_FAST}
        self.t_b = dict(PRIOR_T_B)

    def observe_round(self, hit: bool, committed: int, backup: str | None) -> None:
        """One sequence's round: whether it hit, the tokens it committed (k + 1), and the backup
        used on a miss (None: no backup ran, so no E_miss is updated)."""
        self.p_hit = self._ema(self.p_hit, 1.0 if hit else 0.0)
        if hit:
            self.e_hit = self._ema(self.e_hit, committed)
        elif backup is not None:
            self.e_miss[backup] = self._ema(self.e_miss[self._kind(backup)], committed)

    def observe_times(
        self,
        verify_s: float,
        primary_s: float | None = None,
        backup_s: dict[str, float] | None = None,
        other_s: float | None = None,
    ) -> None:
        """One round's measured seconds, stored relative to the verification time."""
        if verify_s <= 0:
            raise ValueError(f"verify_s must be > 0, got {verify_s}")
        if primary_s is not None:
            self.t_p = self._ema(self.t_p, primary_s / verify_s)
        if other_s is not None:
            self.t_o = self._ema(self.t_o, max(other_s, 0.0) / verify_s)
        for kind, seconds in (backup_s or {}).items():
            self.t_b[kind] = self._ema(self.t_b[self._kind(kind)], seconds / verify_s)

    def predicted(self, batch: int, kind: str) -> float:
        """Predicted speedup over AR at batch size ``batch`` if misses use ``kind``."""
        kind = self._kind(kind)
        return predicted_speedup(
            self.p_hit, self.e_hit, self.e_miss[kind], batch, self.t_p, self.t_b[kind], self.t_o
        )

    def choose(self, batch: int) -> str:
        """The backup for this batch's misses: the forced kind, or the better predicted one
        (neural on a tie)."""
        if self.mode != "auto":
            return self.mode
        return max(BACKUP_KINDS, key=lambda kind: self.predicted(batch, kind))

    def snapshot(self) -> dict[str, float | str]:
        """The current estimates, flat, for metrics."""
        out: dict[str, float | str] = {"mode": self.mode, "p_hit": self.p_hit, "e_hit": self.e_hit}
        out["t_p"], out["t_o"] = self.t_p, self.t_o
        for kind in BACKUP_KINDS:
            out[f"e_miss_{kind}"] = self.e_miss[kind]
            out[f"t_b_{kind}"] = self.t_b[kind]
        return out

    def _ema(self, old: float, new: float) -> float:
        return old + self.alpha * (new - old)

    @staticmethod
    def _kind(kind: str) -> str:
        if kind not in BACKUP_KINDS:
            raise ValueError(f"unknown backup kind {kind!r}; expected one of {BACKUP_KINDS}")
        return kind
