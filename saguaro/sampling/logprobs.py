"""Log-probabilities of committed tokens and of their most likely alternatives.

Two distributions, as a request's ``logprobs_mode`` names them:

* ``raw``: ``log_softmax`` of the model's logits, before anything the request sets;
* ``processed``: ``log p`` of the distribution the token is drawn from, after the logits
  processors, temperature, min-p, top-k and top-p (``-inf`` outside the kept set). A greedy
  request (T = 0) is reported at temperature 1: its point mass would say nothing.

Under speculation the committed token j of a round is reported from the row that decided it,
scored after ``s_1..s_{j-1}``, which were committed before it: the same prefix AR scores it
after. The values are AR's up to the rounding of the forward (bit for bit on saguaro's kernels,
which compute a token's logits alone whatever shares its forward).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from saguaro.sampling.params import LogprobsMode
from saguaro.sampling.probs import SamplingTensors, process


@dataclass(frozen=True)
class TokenLogprob:
    """One committed token's log-probability and the ``top`` alternatives, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def log_probs(logits: torch.Tensor, st: SamplingTensors, mode: LogprobsMode) -> torch.Tensor:
    """[m, V] float32 log-probabilities of the rows ``logits`` under ``mode``."""
    if mode == "raw":
        return torch.log_softmax(logits.float(), dim=-1)
    sampled = replace(st, temperature=torch.where(st.greedy, 1.0, st.temperature))
    dist = process(logits, sampled)
    assert dist.z is not None  # no row is greedy any more
    lp = dist.z - dist.lse[:, None]
    return lp.masked_fill_(dist.z < dist.thr[:, None], -torch.inf)


def token_logprobs(
    logits: torch.Tensor,
    tokens: list[int],
    st: SamplingTensors,
    num_top: list[int],
    mode: LogprobsMode,
) -> list[TokenLogprob]:
    """Row i of ``logits`` [m, V] (transforms ``st`` row i) scored ``tokens[i]``: its
    log-probability and ``num_top[i]`` alternatives."""
    if not tokens:
        return []
    lp = log_probs(logits, st, mode)
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    width = max(num_top)
    top_lp, top_ids = lp.topk(width, dim=-1) if width else (lp[:, :0], lp[:, :0].long())
    top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
    out = []
    for i, tok in enumerate(tokens):
        top = zip(top_ids[i][: num_top[i]], top_lp[i][: num_top[i]], strict=True)
        out.append(TokenLogprob(tok, chosen[i], tuple(top)))
    return out
