"""The words the app, the terminal, the report and the command line share, said one way in all of them."""

# a model built with ``@random``: its figures are controls, not findings
RANDOM_WEIGHTS = "random weights: the token layout is the real one, but nothing is learned, so the maps show no learned attention"


def sentence(words: str) -> str:
    """``words`` as a sentence of its own: a capital first, a full stop last."""
    return f"{words[0].upper()}{words[1:]}."
