"""TextSpan (``methods.text_span``) against the authors' function transcribed (``text_span_reference``), and on data
whose answer is planted."""

import numpy as np
import pytest
from text_span_reference import replace_with_iterative_removal

from vit_explorer import text_span
from vit_explorer.errors import VitExplorerError


@pytest.mark.parametrize(("images", "dim", "bank", "iters", "rank"), [(40, 16, 60, 5, 8), (25, 32, 200, 10, 20),
                                                                      (100, 8, 30, 8, 8)])
def test_text_span_equals_the_authors_function(images, dim, bank, iters, rank):
    generator = np.random.default_rng(images * dim)
    data = generator.normal(size=(images, dim)).astype(np.float32)
    features = generator.normal(size=(bank, dim)).astype(np.float32)
    texts = [f"text {index}" for index in range(bank)]
    reconstruction, chosen = text_span(data, features, texts, iters, rank)
    theirs, their_texts = replace_with_iterative_removal(data.copy(), features.copy(), texts, iters, rank)
    assert chosen == their_texts and len(set(chosen)) == iters
    np.testing.assert_allclose(reconstruction, theirs, atol=1e-5)
    assert reconstruction.shape == (images, dim) and reconstruction.dtype == np.float32
    # their code run literally on a CPU chooses the same texts; only its reconstruction's rows share one row of memory
    literal_reconstruction, literal_texts = replace_with_iterative_removal(data.copy(), features.copy(), texts, iters, rank,
                                                                           dense=False)
    assert literal_texts == chosen
    assert not np.allclose(reconstruction[0], reconstruction[1])  # each image its own row here


def test_text_span_finds_the_planted_directions_in_order_and_rebuilds_the_data():
    """Outputs that vary along texts 3 (most) and 7 (less) and nowhere else: those two are chosen first, and their two
    directions rebuild the outputs."""
    generator = np.random.default_rng(0)
    features = generator.normal(size=(12, 6))
    data = (5.0 * generator.normal(size=(50, 1)) * features[3] + 2.0 * generator.normal(size=(50, 1)) * features[7]
            + features[0]).astype(np.float32)  # a constant offset: the mean, not a direction
    texts = [f"text {index}" for index in range(12)]
    # rank 3: the uncentred outputs span the offset and the two directions
    reconstruction, chosen = text_span(data, features.astype(np.float32), texts, iters=2, rank=3)
    assert chosen == ["text 3", "text 7"]
    np.testing.assert_allclose(reconstruction, data, atol=1e-3)


def test_text_span_says_what_is_wrong_with_its_inputs():
    data, features = np.zeros((4, 3), np.float32), np.ones((5, 3), np.float32)
    with pytest.raises(VitExplorerError, match="one dim"):
        text_span(data, np.ones((5, 4), np.float32), ["t"] * 5, 1, 1)
    with pytest.raises(VitExplorerError, match="4 texts for 5"):
        text_span(data, features, ["t"] * 4, 1, 1)
    with pytest.raises(VitExplorerError, match="rank in 1..3"):
        text_span(data, features, ["t"] * 5, 2, 4)
