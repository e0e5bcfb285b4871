"""The Export tab: the zip the CLI would write, the session's report, and results always under their own target."""

import html
import zipfile
from pathlib import Path

import numpy as np
from app_support import (
    CLASS_MAPS,
    CONTROLS,
    EXPORT,
    analysed,
    opened,
)

from vit_explorer.web.tabs import class_maps, export, shared
from vit_explorer.web.tabs import head_ablation as ablation_tab


def test_export_zips_what_the_cli_writes(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    note = opened(EXPORT, session)["export_note"]
    assert "every head's full map adds 6.0 MiB" in note  # 6 layers × 4 heads × 257² float32, said before writing
    archive = export.on_export(session, True, *CONTROLS)
    with zipfile.ZipFile(archive) as bundle:
        names = set(bundle.namelist())
        assert {"attention.npz", "rollout.png", "heads.png"} <= names
        with bundle.open("attention.npz") as handle:
            full = np.load(handle)["attentions"]
            assert full.shape == (6, 4, 257, 257)
    with zipfile.ZipFile(export.on_export(session, False, *CONTROLS)) as bundle, bundle.open("attention.npz") as handle:
        compact = np.load(handle)
        assert "attentions" not in compact  # by default the compact form only: the head means of those maps
        np.testing.assert_allclose(compact["head_mean"], full.mean(axis=1), atol=1e-3)


def test_the_export_tab_writes_the_sessions_report_with_what_ran(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    before = Path(export.on_report(session, *CONTROLS)).read_text()
    assert "<h2>Faithfulness" not in before and "data:image/png;base64," in before
    class_maps.on_score(models, session, "blur", *CONTROLS)  # a score on this session's map joins the report
    after = Path(export.on_report(session, *CONTROLS)).read_text()
    assert f"<h2>Faithfulness for {session.analysis.label(session.target)}</h2>" in after, after[-3000:]
    assert "relevance (Chefer et al.)" in after and Path(checkpoint).name in after
    assert "<script" not in after


def test_a_report_never_shows_one_targets_results_under_anothers_name(models, upload, checkpoint):
    """Score, sanity check and scoreboard for the top class, then another target and its ablation: the report holds the
    ablation of the new target, and none of the old target's results, which the page no longer shows either."""
    session, _ = analysed(models, upload, checkpoint)
    first = session.target
    class_maps.on_score(models, session, "blur", *CONTROLS)
    class_maps.on_sanity(models, session, *CONTROLS)
    class_maps.on_scoreboard(models, session, "blur", *CONTROLS)
    both = Path(export.on_report(session, *CONTROLS)).read_text()
    name = html.escape(session.analysis.label(first))
    for heading in (f"<h2>Faithfulness for {name}</h2>", f"<h2>Sanity check for {name}</h2>", f"<h2>Scoreboard for {name}</h2>"):
        assert heading in both, heading
    other = next(index for index in range(session.analysis.num_classes) if index != first)
    shared.on_target(models, session, other, CLASS_MAPS, *CONTROLS)
    ablation_tab.on_run(models, session, *CONTROLS)
    report = Path(export.on_report(session, *CONTROLS)).read_text()
    assert f"<h2>Class maps for {html.escape(session.analysis.label(other))}</h2>" in report
    assert f"<h2>Head ablation for {html.escape(session.analysis.label(other))}</h2>" in report
    assert "<h2>Faithfulness" not in report and "<h2>Sanity check" not in report and "<h2>Scoreboard" not in report
    assert "percentage points" in report and "% probability" not in report
