"""The target's own greedy continuations, for two uses during training.

1. **Sequence-level unlikelihood** (Welleck et al., 2019, "Neural text generation with
   unlikelihood training"). A small LM decoded greedily falls into loops because every repeat
   makes the next repeat likelier; next-token cross-entropy on human text never sees, let alone
   penalises, the model's own loops. So the target decodes continuations ``c`` of training
   prefixes, and each continuation token ``c_t`` that belongs to a repeated n-gram (one that
   already occurred earlier in prefix + continuation) is pushed down:

       L_UL = -(1 / |c|) * sum_t m_t * log(1 - p_target(c_t | prefix, c_<t)),

   with ``m_t = 1`` on those tokens and 0 elsewhere. Nothing else about the distribution is
   targeted: tokens of fresh n-grams carry no loss, so the mass taken from a repeat goes
   wherever the model puts it (DITTO, ``saguaro/train/loops.py``, keeps it within corpus text).
2. **On-policy distillation of the draft.** Speculative decoding asks the draft to predict the
   target on text the *target* wrote, so the draft also learns KL(target || draft) on these
   continuations, not only on human text.
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

# log(1 - p) is -inf at p = 1: p is clamped this far below 1, as a confidently repeated token is
# the common case.
P_MAX = 1 - 1e-6
# n-gram length that makes a repeat: long enough that the short phrases code reuses everywhere
# (``) -> ``, ``self.``) do not count.
REPEAT_NGRAM = 4


def cache_name(model: PreTrainedModel) -> str:
    """The KV cache's argument and output field: transformers 5 renamed ``past_key_values``
    to ``cache``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def greedy_rollouts(
    model: PreTrainedModel, prefixes: torch.Tensor, new_tokens: int
) -> torch.Tensor:
    """``[B, P + new_tokens]``: each prefix followed by ``new_tokens`` greedy tokens (end-of-text
    does not stop it; the continuation is training data, not an answer)."""
    name = cache_name(model)
    was_training = model.training
    model.eval()
    out = model(input_ids=prefixes, use_cache=True)
    pieces = [prefixes]
    for i in range(new_tokens):
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        pieces.append(nxt)
        if i + 1 < new_tokens:
            out = model(input_ids=nxt, use_cache=True, **{name: getattr(out, name)})
    model.train(was_training)
    return torch.cat(pieces, dim=1)


def repeat_mask(seq: torch.Tensor, start: int, n: int = REPEAT_NGRAM) -> torch.Tensor:
    """``m[b, t]`` is true where ``t >= start`` and token ``t`` lies in an n-gram of row ``b`` that
    also occurs, in full, earlier in that row (ending before this occurrence ends)."""
    mask = torch.zeros_like(seq, dtype=torch.bool)
    for b, row in enumerate(seq.tolist()):
        seen: set[tuple[int, ...]] = set()
        for end in range(n, len(row) + 1):
            gram = tuple(row[end - n : end])
            if gram in seen and end > start:
                mask[b, max(start, end - n) : end] = True
            seen.add(gram)
    return mask


def unlikelihood_loss(
    logits: torch.Tensor, seq: torch.Tensor, mask: torch.Tensor, start: int
) -> torch.Tensor:
    """L_UL above. ``logits[:, t]`` predicts ``seq[:, t + 1]``; ``start`` is the prefix length."""
    pred = logits[:, start - 1 : -1].float()
    tok = seq[:, start:]
    p = pred.softmax(-1).gather(-1, tok[..., None])[..., 0]
    penalty = -torch.log1p(-p.clamp(max=P_MAX))
    return (penalty * mask[:, start:]).sum() / tok.numel()
