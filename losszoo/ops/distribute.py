"""The old path of :mod:`losszoo.ops.dro.distribute` (the same module object)."""

import sys

from losszoo.ops.dro import distribute

sys.modules[__name__] = distribute
