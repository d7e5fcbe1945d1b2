"""A package's public names imported on first use (PEP 562), so ``import tokenmix`` loads almost nothing
and each name brings only the modules it needs."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package``, whose public name ``n`` lives in its submodule ``exports[n]``
    (relative, e.g. ``".models"``); a name is imported once, then kept as a plain attribute."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
