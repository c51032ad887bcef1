"""Command line: ``python -m losszoo list`` prints the registry as a table."""

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
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m losszoo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="print registered names, kinds, classes, descriptions")
    listing.add_argument("--kind", default=None, help="only this kind (loss, head, metric)")
    args = parser.parse_args(argv)

    import losszoo

    if args.command == "list":
        rows = [
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
