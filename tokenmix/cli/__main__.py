"""``python -m tokenmix.cli``: the ``tokenmix`` command (what torchrun runs)."""

import sys

from . import main

sys.exit(main())
