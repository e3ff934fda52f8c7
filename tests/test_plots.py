"""Plots (dpcore.report.plots): PNGs written atomically."""

from __future__ import annotations

from dpcore.report.plots import roc_plot


def test_roc_plot_writes_png_atomically(tmp_path, fake_audit_result):
    path = roc_plot([fake_audit_result("non-private", 2.0), fake_audit_result("dp", 0.0, seed=1)], tmp_path / "roc.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["roc.png"]
