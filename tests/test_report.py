"""The figures users read are generated: docs/results.md and the README's table match bench/report.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import report as module
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


def test_docs_results_and_the_readme_table_are_what_the_report_writes(report):
    assert (ROOT / "docs" / "results.md").read_text() == report.render_results(), "run python bench/report.py"
    readme = (ROOT / "README.md").read_text()
    assert report.readme_with_headline(readme) == readme, "run python bench/report.py"
    assert report.main(["--check"]) == 0


def test_the_check_fails_on_a_stale_file_and_a_readme_without_markers(report, tmp_path, monkeypatch, capsys):
    stale = tmp_path / "results.md"
    stale.write_text("# Results\n\nold figures\n")
    monkeypatch.setattr(report, "DOC", stale)
    monkeypatch.setattr(report, "ROOT", tmp_path.parent)
    assert report.main(["--check"]) == 1
    assert "results.md is out of date" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no results block"):
        report.readme_with_headline("# a README without the markers\n")


def test_every_testbed_result_is_reported_and_kept_runs_give_periods(report):
    names = report.testbed_names()
    text = report.render_results()
    assert names and all(f"### {name}" in text for name in names)
    latest = {r.mode: r for r in report.testbed_rows("testbed_resnet18_550mbit_period")}
    assert latest["overlap"].by_period and latest["ddp"].speedup == 1.0
    assert latest["overlap"].speedup_vs["ddp"] > 1.0


def test_the_readme_is_a_users_page_that_stands_alone():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for doc in ("design", "runtime", "solvers", "simulator", "formats", "testbed", "results", "development"):
        assert (ROOT / "docs" / f"{doc}.md").is_file(), doc
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        assert "../shared" not in path.read_text(), path.name
