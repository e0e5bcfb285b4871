"""Pictures and files: colour tables and overlays (``render``), the views of an analysis (``pictures``),
matplotlib charts (``charts``), the tables of the app's native plots (``plots``), and what the CLI and
the export write (``files``). numpy lives here, where a tensor becomes pixels or bytes.
"""
