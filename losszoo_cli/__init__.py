"""The ``losszoo`` command line, kept outside the :mod:`losszoo` package so that it answers
without importing it (importing losszoo starts Keras and its backend, e.g. TensorFlow).

``losszoo --help`` imports only :mod:`argparse`; ``losszoo list`` reads the built-in entries
from losszoo's source (:func:`builtin_entries`: the ``@register(...)`` decorators as
written, parsed, never run), which ``tests/test_cli.py`` keeps equal to the live registry.
Only when a plugin is installed (entry-point group ``losszoo.plugins``) or losszoo is already
imported (``python -m losszoo`` imports it before running its ``__main__``) does ``list``
read the live registry, which holds the plugins' names too.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import pathlib
import sys

PLUGIN_GROUP = "losszoo.plugins"  # the same as losszoo.registry.PLUGIN_GROUP (a test checks)
KINDS = ("loss", "head", "metric")  # the same as losszoo.registry.KINDS (a test checks)
HEADER = ["name", "kind", "class", "description"]


def format_table(rows: list[list[str]], header: list[str]) -> str:
    """Render rows as a GitHub-flavoured Markdown table (readable in a terminal too)."""
    rows = [[str(cell).replace("|", "\\|") for cell in row] for row in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def builtin_entries() -> list[tuple]:
    """The built-in registry entries, read from losszoo's source without importing it.

    Every class of the package decorated with ``@register(name, kind=..., aliases=...,
    description=...)`` (its arguments are literals), with the registry's defaults: kind
    ``"loss"``, the first docstring line as the description.

    Returns:
      ``(name, aliases, kind, class path, description)`` tuples, sorted as
      ``losszoo.entries()`` sorts (by kind, then name).
    """
    root = pathlib.Path(importlib.util.find_spec("losszoo").origin).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for cls in ast.parse(path.read_text(encoding="utf-8")).body:
            for deco in getattr(cls, "decorator_list", ()):
                func = getattr(deco, "func", None)
                if getattr(func, "id", getattr(func, "attr", None)) != "register":
                    continue
                args = dict(zip(("name", "kind", "aliases", "description"), deco.args))
                args.update((k.arg, k.value) for k in deco.keywords)
                args = {key: ast.literal_eval(value) for key, value in args.items()}
                doc = (ast.get_docstring(cls, clean=False) or "").strip().splitlines()
                description = args.get("description") or (doc[0] if doc else "")
                kind = args.get("kind", "loss")
                aliases = tuple(args.get("aliases", ()))
                found.append((args["name"], aliases, kind, f"{module}.{cls.name}", description))
    return sorted(found, key=lambda e: (KINDS.index(e[2]), e[0]))


def _plugins_installed() -> bool:
    from importlib.metadata import entry_points

    return bool(entry_points(group=PLUGIN_GROUP))


def registry_rows(kind: str | None = None, live: bool | None = None) -> list[list[str]]:
    """The rows of ``losszoo list``: name (aliases), kind, class path, description.

    Args:
      kind: ``"loss"``, ``"head"``, ``"metric"`` or None for every kind.
      live: read the live registry (imports losszoo, which starts Keras); None: only when a
        plugin is installed or losszoo is already imported, else the built-in copy.
    """
    if live is None:
        live = "losszoo.registry" in sys.modules or _plugins_installed()
    if live:
        import losszoo

        entries = [
            (e.name, e.aliases, e.kind, f"{e.cls.__module__}.{e.cls.__qualname__}", e.description)
            for e in losszoo.entries(kind)
        ]
    else:
        entries = [e for e in builtin_entries() if kind is None or e[2] == kind]
    return [
        [name + (f" ({', '.join(aliases)})" if aliases else ""), k, path, description]
        for name, aliases, k, path, description in entries
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the command line (``argv`` defaults to ``sys.argv[1:]``); returns the exit code.

    Example:
      >>> main(["list", "--kind", "head"])  # doctest: +SKIP
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # if a plugin makes list start TF
    parser = argparse.ArgumentParser(
        prog="losszoo",
        description="losszoo: output heads and losses beyond softmax for Keras 3.",
        epilog="Also runnable as `python -m losszoo` (which imports losszoo first, starting "
        "Keras). `losszoo list` prints the registry.",
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
    print(format_table(registry_rows(args.kind), HEADER))  # "list", the only command
    return 0


if __name__ == "__main__":
    sys.exit(main())
