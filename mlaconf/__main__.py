"""``python -m mlaconf``: the same as the ``mlaconf`` console script."""

import sys

from mlaconf import main

sys.exit(main())
