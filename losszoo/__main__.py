"""Command line: ``losszoo list`` (or ``python -m losszoo list``) prints the registry as a table.

``losszoo`` with no command prints this help and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def format_table(rows: list[list[str]], header: list[str]) -> str:
    """Render rows as a GitHub-flavoured Markdown table (readable in a terminal too)."""
    rows = [[str(cell).replace("|", "\\|") for cell in row] for row in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="losszoo",
        description="losszoo: output heads and losses beyond softmax for Keras 3.",
        epilog="Also runnable as `python -m losszoo`. `losszoo list` prints the registry.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    listing = sub.add_parser(
        "list",
        help="print registered names, kinds, classes, descriptions",
        description="Print the registry (built-ins and plugins) as a Markdown table.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    listing.add_argument(
        "--kind",
        default=None,
        choices=("loss", "head", "metric"),
        help="only this kind; None lists every kind",
    )
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0

    import losszoo

    rows = [  # args.command is "list", the only command
        [
            e.name + (f" ({', '.join(e.aliases)})" if e.aliases else ""),
            e.kind,
            f"{e.cls.__module__}.{e.cls.__qualname__}",
            e.description,
        ]
        for e in losszoo.entries(args.kind)
    ]
    print(format_table(rows, ["name", "kind", "class", "description"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
