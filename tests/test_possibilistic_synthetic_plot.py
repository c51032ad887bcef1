"""examples/possibilistic_synthetic.py: the accuracy chart shows every bar (issue 19: its
y-axis started at 0.5 and hid Model B's 0.26 bar in the --smoke run)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow_only(reason="the example runs on TensorFlow")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "possibilistic_synthetic.py"


def test_accuracy_axis_starts_at_zero_and_every_bar_is_drawn_in_full():
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("example_possibilistic_plot", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    rows = [
        (30, 0.40, 200, 0.01, 0.001, [0.91], [0.26]),
        (30, 0.60, 200, 0.01, 0.001, [0.88, 0.90], [0.41, 0.45]),
    ]
    fig = module.plot_accuracies(rows, runs=1, png=None)
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    from matplotlib.container import BarContainer

    bars = [bar for c in ax.containers if isinstance(c, BarContainer) for bar in c]
    heights = [bar.get_height() for bar in bars]
    np.testing.assert_allclose(sorted(heights), sorted([0.91, 0.89, 0.26, 0.43]), rtol=1e-12)
    assert low <= 0.0 and high >= 1.0  # accuracies live in [0, 1]: all of it is shown
    assert all(bar.get_y() >= low for bar in bars)
