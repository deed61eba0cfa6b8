"""``python -m fastspec.training ...``: the same as ``fastspec train ...``."""
import sys

from fastspec.training.command import main

sys.exit(main())
