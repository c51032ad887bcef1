"""Reliability diagram: readable layout, bar colours that match the legend, install hint."""

import sys

import numpy as np
import pytest

from losszoo import calibration as C


def _probs(rng, n, k, sharpen):
    logits = rng.normal(size=(n, k)) * sharpen
    p = np.exp(logits - logits.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True), rng.integers(0, k, n)


def test_panels_wrap_into_rows_and_bars_match_the_curve():
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(0)
    p, y = _probs(rng, 400, 4, 3.0)
    y = np.where(rng.random(400) < 0.8, p.argmax(1), y)  # 80%+ accurate at every confidence
    fig = C.reliability_diagram({f"m{i}": p for i in range(5)}, y, n_bins=10)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 5 and len(fig.axes) == 6  # 2 rows x 3, one hidden
    width, height = fig.get_size_inches()
    assert width / height < 2.0  # not a thin strip
    conf, acc, count = C.reliability_curve(p, y, 10)
    full = count > 0
    ax = visible[0]
    blue, red, green = (c for c in ax.containers)
    np.testing.assert_allclose(
        [b.get_height() for b in blue], np.minimum(acc, conf)[full], rtol=1e-12
    )
    over, under = (conf > acc)[full], (acc > conf)[full]
    np.testing.assert_allclose(
        sorted(b.get_height() for b in red), sorted((conf - acc)[full][over]), rtol=1e-12
    )
    np.testing.assert_allclose(
        sorted(b.get_height() for b in green), sorted((acc - conf)[full][under]), rtol=1e-12
    )
    assert over.any() and under.any()  # both colours drawn
    labels = fig.legends[0].get_texts()
    assert any("overconfident" in t.get_text() for t in labels)
    assert any("underconfident" in t.get_text() for t in labels)
    assert f"ECE {C.ece(p, y, 10):.4f}" in ax.get_title()


def test_missing_matplotlib_gives_install_hint(monkeypatch):
    rng = np.random.default_rng(1)
    p, y = _probs(rng, 20, 3, 1.0)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'losszoo\[examples\]'"):
        C.reliability_diagram({"a": p}, y)


@pytest.mark.parametrize("n_bins", [0, -3, 2.5, True, "15"])
def test_n_bins_must_be_a_positive_integer(n_bins):
    # issue 19: reliability_curve(n_bins=0) returned one bin; every n_bins is checked alike
    p, y = _probs(np.random.default_rng(2), 20, 3, 1.0)
    for fn in (C.reliability_curve, C.ece, C.classwise_ece, C.adaptive_ece):
        with pytest.raises((ValueError, TypeError), match="n_bins"):
            fn(p, y, n_bins=n_bins)
    with pytest.raises((ValueError, TypeError), match="n_bins"):
        C.reliability_diagram({"a": p}, y, n_bins=n_bins)
    for cls in (C.ExpectedCalibrationError, C.AdaptiveECE, C.ClasswiseECE):
        with pytest.raises((ValueError, TypeError), match="n_bins"):
            cls(n_bins=n_bins)


def test_reliability_curve_counts_match_brute_force_binning():
    p, y = _probs(np.random.default_rng(4), 60, 3, 2.0)
    conf, acc, count = C.reliability_curve(p, y, n_bins=4)
    top = p.max(1)
    for m in range(4):  # right-closed bins ((m)/4, (m+1)/4], 0 in the first
        sel = (top > m / 4) & (top <= (m + 1) / 4)
        assert count[m] == sel.sum()
        if sel.any():
            np.testing.assert_allclose(conf[m], top[sel].mean(), rtol=1e-12)
            np.testing.assert_allclose(acc[m], (p[sel].argmax(1) == y[sel]).mean(), rtol=1e-12)
