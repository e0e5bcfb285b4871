"""The Test-time register tab: the planted model without and with its register, side by side, and the scoreboard of
both; without a registers file it says how to get one."""

import numpy as np
import torch
from app_support import CONTROLS, analysed, by_name, opened
from conftest import photo
from test_norms import PLANTED, loaded
from test_registers import planted_sink_vit

from vit_explorer.core.register_neurons import REGISTER
from vit_explorer.methods.registers import calibrate
from vit_explorer.web.captions import NO_REGISTERS
from vit_explorer.web.session import ModelCache
from vit_explorer.web.tabs import registers as registers_tab

TITLE = "Test-time register"


def planted_session(tmp_path, with_file: bool):
    """The model cache (with the planted model's registers file or without one) and the tab opened on a new image."""
    model = loaded(planted_sink_vit(), (64, 64))
    neurons = calibrate(model, [photo((64, 64), seed=seed) for seed in range(4)], top_k=2, highest_layer=2, detect_layer=-1)
    models = ModelCache(registers=neurons if with_file else None)
    models.put("planted", model)
    upload = tmp_path / "image.png"
    photo((64, 64), seed=40).save(upload)
    session, _ = analysed(models, str(upload), "planted")
    return models, session, opened(TITLE, session)


def test_the_tab_shows_both_sides_and_the_planted_outlier_gone_with_the_register(tmp_path):
    models, session, views = planted_session(tmp_path, with_file=True)
    text = views["register_text"]
    assert "2 register neurons chosen in layer(s) 0, 1" in text and "The edit changes the model" in text
    assert "High-norm patches in any layer (the Token norms rule): 1 without, 0 with" in text
    for name in registers_tab.PICTURES:
        assert isinstance(views[name], np.ndarray) and views[name].shape[2] == 3, name
    with_register = registers_tab.view(session).analysis
    assert with_register.layout.prefix_names == ("cls", REGISTER)
    assert session.analysis.layout.prefix_names == ("cls",)  # the session's own model is untouched
    # the patch's norm in the last layer falls to the rest's, and the register carries the artefact
    norms_without, norms_with = session.analysis.token_norms[-1], with_register.token_norms[-1]
    assert norms_without[PLANTED] > 5 * norms_without[1:].median()
    assert norms_with[PLANTED + 1] < 2 * norms_with[2:].median() < norms_with[1]
    assert models.with_register(models.get("planted")) is models.with_register(models.get("planted"))  # made once
    # both scoreboards, for the same class
    boards = by_name(registers_tab.on_score(models, session, *CONTROLS), registers_tab.BOARDS)
    assert boards["register_board_text"].count("**Scoreboard** for") == 2
    for side in registers_tab.SIDES:
        assert boards[f"register_table_{side}"]["visible"] and len(boards[f"register_table_{side}"]["value"]) == 6
    first, second = registers_tab.view(session).boards
    assert first.target == second.target and not torch.equal(session.analysis.logits, with_register.logits)


def test_without_a_registers_file_the_tab_says_how_to_get_one(tmp_path):
    _, _, views = planted_session(tmp_path, with_file=False)
    assert views["register_text"] == NO_REGISTERS and all(views[name] is None for name in registers_tab.PICTURES)
