"""The core: one image through a model, every layer's attention captured and kept in an ``Analysis``, and what one
target of that image is made of.

``images`` (decode, fit) → ``capture`` (one forward [+ one backward] pass, maps handed to a sink) →
``analysis`` (the maps of one image, full or compact, and a target's evidence) → ``maps``, ``rollout``,
``relevance``, ``statistics``: pure torch math on them. A target's AttnLRP and LeGrad maps (``attnlrp``, ``legrad``)
and its decomposition (``decomposition``) take one more forward and backward pass each, made by
``analysis.class_evidence`` and kept on the evidence; ``targets`` are what a target can be; ``comparison`` lines up two
analyses. The values the methods produce live here too (``curves``, ``ranking``, ``interventions``, ``token_norms``),
so that drawing reads them without importing what runs a model. Imports only ``models`` below it.
"""
