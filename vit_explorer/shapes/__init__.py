"""The built-in model's world: the generator of labelled shapes with their masks (``generator``) and the
training of the shipped model on it (``train``), with its held-out figures.
"""
