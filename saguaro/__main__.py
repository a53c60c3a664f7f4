"""``python -m saguaro``: the same as the ``saguaro`` command."""

import sys

from saguaro.cli import main

sys.exit(main())
