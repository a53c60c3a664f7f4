"""``python -m saguaro.kernels``: build the CPU kernels for this machine now (see build.main)."""

from saguaro.kernels.build import main

raise SystemExit(main())
