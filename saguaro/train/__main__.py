import sys

from saguaro.train import main

sys.exit(main())
