"""``python -m saguaro.bench``: the same as ``saguaro bench``."""

import sys

from saguaro.bench import bench_main
from saguaro.errors import run_command

sys.exit(run_command("saguaro bench", bench_main, sys.argv[1:]))
