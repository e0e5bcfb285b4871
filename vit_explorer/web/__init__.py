"""The Gradio app: the page (``app``), the per-session state and model cache (``session``), the words
on the page (``captions``), uploads (``upload``) and one module per tab (``tabs``). Thin: every number
comes from ``core``, ``methods`` and ``draw``.
"""
