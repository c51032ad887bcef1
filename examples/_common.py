"""Conventions shared by the example scripts.

- Output: results go to a fresh folder ``out/<script>-<UTC time>`` (under the current
  directory) unless ``--out`` names one; the committed results are only rewritten with
  ``--out examples/results``. Every written file's path is printed (:func:`wrote`).
- Help: every option has a help text, and ``--help`` shows its default (:func:`make_parser`).
- Progress: quiet by default, one progress bar per training run (:class:`RunProgress`,
  Keras' ``Progbar``), the table at the end.
- Summaries: ``mean ± std`` only when there are at least two seeds (:func:`fmt_stat`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Keeps the module docstring's layout and appends ``(default: ...)`` to every option."""


def make_parser(script: str, doc: str) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` named ``python examples/<script>.py`` with the docstring as
    description and ``--out`` already added."""
    parser = argparse.ArgumentParser(
        prog=f"python examples/{script}.py", description=doc, formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--out",
        default=None,
        help="folder for the results; when unset, a fresh folder out/<script>-<UTC time> under "
        "the current directory (pass examples/results to rewrite the committed results)",
    )
    return parser


def output_dir(out: str | None, script: str) -> Path:
    """The folder to write into: ``out`` if given, else a new ``out/<script>-<UTC time>``."""
    if out is not None:
        path = Path(out)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = Path("out") / f"{script}-{stamp}"
        suffix = 1
        while path.exists():
            suffix += 1
            path = Path("out") / f"{script}-{stamp}-{suffix}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def wrote(path: Path) -> Path:
    """Print that ``path`` was written and return it."""
    print(f"wrote {path}", flush=True)
    return path


def command_line(script: str, argv: list[str] | None) -> str:
    """The command as a user would type it (for the header of results files)."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join([f"python examples/{script}.py", *args])


def fmt_stat(values, digits: int = 4) -> str:
    """``mean ± std`` (sample std) over seeds; a single value as is (no spread from one run)."""
    values = np.asarray(values, float).ravel()
    if values.size == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def seeds_note(n: int) -> str:
    """How to read the table's numbers given the number of seeds."""
    if n == 1:
        return (
            "One seed: single runs, no spread estimate; run with more seeds before "
            "calling any difference real."
        )
    return f"Mean ± sample standard deviation over {n} seeds."


class RunProgress:
    """One progress bar per training run, advanced once per epoch (Keras' ``Progbar``).

    On a terminal the bar redraws in place; when the output is piped or captured it prints a
    single line when the run ends. ``callback()`` gives a Keras 3 callback for ``model.fit``;
    loops that train epoch by epoch call :meth:`update` themselves.
    """

    def __init__(
        self,
        label: str,
        epochs: int,
        enabled: bool = True,
        metrics=("loss",),
        unit_name: str = "epoch",
    ):
        import keras

        self.enabled = enabled
        self.epochs = epochs
        self.done = 0
        self.metrics = tuple(metrics)
        if enabled:
            print(label, flush=True)
            verbose = 1 if sys.stdout.isatty() else 2
            self.bar = keras.utils.Progbar(
                epochs, verbose=verbose, stateful_metrics=list(metrics), unit_name=unit_name
            )

    def update(self, values: dict | None = None, finished: bool = False) -> None:
        """Advance by one epoch (``finished``: the run stopped early; close the bar)."""
        self.done += 1
        if not self.enabled:
            return
        items = [(k, float(v)) for k, v in (values or {}).items()]
        self.bar.update(
            min(self.done, self.epochs), values=items, finalize=finished or self.done >= self.epochs
        )

    def callback(self):
        import keras

        progress = self

        class _EpochBar(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                logs = logs or {}
                progress.update({k: logs[k] for k in progress.metrics if k in logs})

        return _EpochBar()
