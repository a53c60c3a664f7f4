"""Logits processing, seeded sampling, lossless verification and Saguaro sampling."""

from saguaro.sampling.params import SamplingParams
from saguaro.sampling.probs import SamplingTensors, logits_to_probs
from saguaro.sampling.saguaro import saguaro_probs
from saguaro.sampling.sampler import Generators, sample
from saguaro.sampling.verify import VerifyResult, verify

__all__ = [
    "Generators",
    "SamplingParams",
    "SamplingTensors",
    "VerifyResult",
    "logits_to_probs",
    "sample",
    "saguaro_probs",
    "verify",
]
