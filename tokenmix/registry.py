"""A name -> entry table (mixers, models, ops): one entry per name, and a miss that lists the names."""

from __future__ import annotations

from typing import Generic, TypeVar

Entry = TypeVar("Entry")


class Registry(Generic[Entry]):
    """``what`` names a lookup's argument in its error, e.g. "mixer name must be one of [...]"."""

    def __init__(self, what: str, entries: dict[str, Entry] | None = None):
        self.what = what
        self._entries: dict[str, Entry] = dict(entries or {})

    def add(self, name: str, entry: Entry) -> Entry:
        if name in self._entries:
            raise ValueError(f"{self.what.split()[0]} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __getitem__(self, name: str) -> Entry:
        if name not in self._entries:
            raise ValueError(f"{self.what} must be one of {self.names()}, got {name!r}")
        return self._entries[name]
