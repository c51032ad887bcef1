"""``python -m losszoo``: the command line of :mod:`losszoo_cli` (``list``, ``--help``).

Python imports the losszoo package (and so Keras and its backend) before it runs this module;
the ``losszoo`` console script runs :func:`losszoo_cli.main` without that import and answers
``--help`` and ``list`` without starting a Keras backend.
"""

import sys

from losszoo_cli import format_table, main

__all__ = ["format_table", "main"]

if __name__ == "__main__":
    sys.exit(main())
