"""The core: an image through a model once, every layer's attention captured, kept in an ``Analysis``.

``images`` (decode, fit) → ``capture`` (one forward [+ one backward] pass, maps handed to a sink) →
``analysis`` (the maps of one image, full or compact, and the class evidence) → ``maps``, ``rollout``,
``relevance``, ``statistics``: pure torch math on them. Imports only ``models`` below it.
"""
