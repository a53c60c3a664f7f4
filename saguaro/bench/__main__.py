"""``python -m saguaro.bench``: the same as ``saguaro bench``."""

import sys

from saguaro.bench import bench_main

sys.exit(bench_main(sys.argv[1:]))
