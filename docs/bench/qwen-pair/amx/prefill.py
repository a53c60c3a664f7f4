"""Milliseconds of the target's prefill (a prompt of P random tokens, logits at its last) on the
checkout this runs from, medians of 3: ``prefill.py MODEL THREADS 64,150,256``."""

import json
import sys

import torch

from saguaro.train.costs import ForwardTimer, median_ms

REPEATS = 3

threads, lengths = int(sys.argv[2]), [int(p) for p in sys.argv[3].split(",")]
torch.set_num_threads(threads)
timer = ForwardTimer(sys.argv[1], max(lengths), kernels=True)
runner = timer.runner
out = {}
for length in lengths:
    query = runner.sequence_query(timer.table, 0, timer.prompt[:length], 1)
    out[length] = median_ms(lambda q=query: runner.forward([q]), REPEATS)
print(json.dumps(out))
