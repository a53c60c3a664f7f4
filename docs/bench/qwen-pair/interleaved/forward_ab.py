"""Milliseconds of one target forward after 200 cached tokens, at each given position count, on
the checkout this runs from (medians of 15): ``forward_ab.py MODEL THREADS 1,5,16``."""

import json
import sys

import torch

from saguaro.train.costs import ForwardTimer

CONTEXT, REPEATS = 200, 15

threads, positions = int(sys.argv[2]), [int(p) for p in sys.argv[3].split(",")]
torch.set_num_threads(threads)
timer = ForwardTimer(sys.argv[1], CONTEXT, kernels=True)
print(json.dumps({p: timer.positions_ms(p, REPEATS) for p in positions}))
