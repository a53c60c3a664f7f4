"""Logits processing, counter-based sampling, lossless verification and Saguaro sampling."""

from saguaro.sampling.noise import Purpose, seed_tensor, uniforms
from saguaro.sampling.params import SamplingParams
from saguaro.sampling.probs import Dist, SamplingTensors, logits_to_probs, process
from saguaro.sampling.saguaro import saguaro_weights
from saguaro.sampling.sampler import DEFAULT_TOP_M, inverse_cdf, propose
from saguaro.sampling.sparse import SparseQ
from saguaro.sampling.verify import VerifyResult, verify

__all__ = [
    "DEFAULT_TOP_M",
    "Dist",
    "Purpose",
    "SamplingParams",
    "SamplingTensors",
    "SparseQ",
    "VerifyResult",
    "inverse_cdf",
    "logits_to_probs",
    "process",
    "propose",
    "saguaro_weights",
    "seed_tensor",
    "uniforms",
    "verify",
]
