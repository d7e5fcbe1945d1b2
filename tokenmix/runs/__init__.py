"""A run on disk: its files (``layout.py``), the checkpoint formats (whole ``checkpoint.py``, sharded
``sharded.py``, format 1 ``legacy.py``), model folders and exports (``folder.py``), weights checked against
their config (``weights.py``), every upgrade of an older format (``migrations.py``), and ``open_run``, which
reads any of them back as a ``Run`` (``open.py``)."""

from .open import Run, open_run

__all__ = ["Run", "open_run"]
