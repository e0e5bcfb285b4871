"""The one exception type for mistakes a user can fix (bad file, unknown model, wrong option)."""


class VitExplorerError(Exception):
    """Raised for input the user can correct; the message says what was wrong and what to do.

    Bugs in vit_explorer itself surface as ordinary exceptions (``AssertionError`` and friends),
    never as this type, so a CLI or app can print this one as a single line.
    """
