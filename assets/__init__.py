"""The shipped model and its example images, installed as the data package ``vit_explorer.assets``
(``pyproject.toml`` maps this folder in); read them through ``importlib.resources``."""
