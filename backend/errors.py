"""Backend errors that reach a user as one line (no traceback). No torch import here."""
from __future__ import annotations


class ModelLoadError(Exception):
    """A model or tokenizer that cannot be loaded; `str(exc)` is a complete one-line message."""
