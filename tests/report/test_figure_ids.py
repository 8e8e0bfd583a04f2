"""Figures reproduce on another install: ids come from what the figure shows, not from a hash of
float text; a plotted value that changes still changes the bytes."""

from __future__ import annotations

from alignatt.report.figures import new_figure, stable_ids, styled, svg_text


def _figure(ys):
    def draw():
        fig, ax = new_figure()
        ax.plot([1, 2, 3], ys, marker="o")
        return fig
    return styled(draw)


def test_two_salts_give_the_same_bytes_and_hashed_ids_are_gone(monkeypatch):
    """Another salt stands for another install: the hashed ids change, the bytes must not."""
    from alignatt.report import figures

    outs = []
    for salt in ("install-a", "install-b"):
        monkeypatch.setitem(figures.SVG_RC, "svg.hashsalt", salt)
        outs.append(svg_text(_figure([1.0, 2.0, 3.0])))
    assert outs[0] == outs[1]
    assert 'clip-path="url(#clip1)"' in outs[0] and 'href="#marker1"' in outs[0]


def test_a_changed_value_changes_the_figure():
    assert svg_text(_figure([1.0, 2.0, 3.0])) != svg_text(_figure([1.0, 2.5, 3.0]))


def test_renaming_keeps_definitions_and_references_paired():
    svg = '<clipPath id="pabcdef0123"/><g clip-path="url(#pabcdef0123)"/><path id="m0123456789"/><use xlink:href="#m0123456789"/>'
    assert stable_ids(svg) == '<clipPath id="clip1"/><g clip-path="url(#clip1)"/><path id="marker1"/><use xlink:href="#marker1"/>'
