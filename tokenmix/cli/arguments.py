"""Reading the command line: argparse over the kinds of ``tokenmix.fields``, and the kinds only the commands use.

A ``Kind`` given as an argument's ``type`` reads its text with ``Kind.parse``: ``Parser`` looks each one
up in argparse's table of type functions (``KindReaders``), so a refused value is one line naming the
argument while the arguments are read, before any work starts. ``KeyValue`` reads ``-o KEY=VALUE``
(model and mixer options, flat: ``tokenmix.models.registry.resolve_model`` resolves them).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..fields import Kind, Number, Text, check_writable


class KindReaders(dict):
    """argparse's table of ``type`` functions, in which a ``Kind`` reads its own text (``Kind.parse``)."""

    def get(self, key, default=None):
        return KindReader(key) if isinstance(key, Kind) else super().get(key, default)


class KindReader:
    """The ``type`` function of an argument of kind ``kind``: its ValueError becomes argparse's error."""

    def __init__(self, kind: Kind):
        self.kind = kind

    def __call__(self, text: str):
        try:
            return self.kind.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None


class Parser(argparse.ArgumentParser):
    """argparse with kinds as types and its errors in one line: the problem and where the help is, without the usage block."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._registries["type"] = KindReaders(self._registries["type"])  # shared with its groups

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


class Lengths(Kind):
    """Comma-separated positive integers, e.g. ``512,1024``."""

    def __init__(self, what: str = "lengths"):
        self.what = what

    def describe(self) -> str:
        return "comma-separated positive integers"

    def parse(self, text: str) -> list[int]:
        try:
            lengths = [int(part) for part in text.split(",")]
        except ValueError:
            raise ValueError(f"{self.what} must be comma-separated integers, got {text!r}") from None
        if min(lengths) < 1:
            raise ValueError(f"{self.what} must be positive integers, got {text!r}")
        return lengths

    def invalid(self) -> list[str]:
        return ["", "x", "512,,1024", "0", "-4", "8,1.5"]


class LengthsAmong(Lengths):
    """Comma-separated integers, each one of ``allowed``, e.g. resolutions ``32,128``."""

    def __init__(self, what: str, allowed: tuple[int, ...]):
        super().__init__(what)
        self.allowed = allowed

    def describe(self) -> str:
        return f"comma-separated integers among {', '.join(map(str, self.allowed))}"

    def parse(self, text: str) -> list[int]:
        values = super().parse(text)
        if any(value not in self.allowed for value in values):
            raise ValueError(f"{self.what} must be among {', '.join(map(str, self.allowed))}, got {text!r}")
        return list(dict.fromkeys(values))

    def invalid(self) -> list[str]:
        return [*super().invalid(), "48", f"{self.allowed[0]},100"]


class Sizes(Kind):
    """Comma-separated positive numbers, e.g. ``1,16`` or ``0.5``."""

    def __init__(self, what: str = "sizes"):
        self.what = what

    def describe(self) -> str:
        return "comma-separated positive numbers"

    def parse(self, text: str) -> list[float]:
        try:
            sizes = [float(part) for part in text.split(",")]
        except ValueError:
            raise ValueError(f"{self.what} must be comma-separated numbers, got {text!r}") from None
        if not all(math.isfinite(size) and size > 0 for size in sizes):
            raise ValueError(f"{self.what} must be positive finite numbers, got {text!r}")
        return sizes

    def invalid(self) -> list[str]:
        return ["", "x", "1,,16", "0", "-1", "1,nan", "inf"]


class Cpus(Kind):
    """CPU numbers this process may run on (its affinity mask, Linux), comma-separated, ranges allowed: ``0,1`` or ``0-3,8``."""

    def describe(self) -> str:
        return "comma-separated CPU numbers or ranges (0-3,8) among those this process may use"

    def parse(self, text: str) -> list[int]:
        from ..runtime import usable_cpus

        cpus = set()
        for part in text.split(","):
            bounds = part.strip().split("-")
            if len(bounds) > 2 or not all(bound.isdigit() for bound in bounds) or int(bounds[0]) > int(bounds[-1]):
                raise ValueError(f"must be {self.describe()}, got {text!r}")
            cpus.update(range(int(bounds[0]), int(bounds[-1]) + 1))
        usable = usable_cpus()
        if not cpus <= usable:
            raise ValueError(f"must be among this process's CPUs {sorted(usable)}, got {text!r}")
        return sorted(cpus)

    def invalid(self) -> list[str]:
        return ["", "x", "-1", "1-", "3-1", "0,,1", "1.5", "100000"]


class Percent(Number):
    """A percentage >= 0, the ``%`` optional (``0.5%`` and ``0.5`` alike), held as a fraction (0.005)."""

    def __init__(self):
        super().__init__(minimum=0)

    def describe(self) -> str:
        return "a percentage >= 0, e.g. 0.5%"

    def parse(self, text: str) -> float:
        try:
            return super().parse(text.removesuffix("%")) / 100
        except ValueError:
            raise ValueError(f"must be {self.describe()}, got {text!r}") from None

    def invalid(self) -> list[str]:
        return [*super().invalid(), "%", "1%%", "-0.5%"]


class ByteSize(Kind):
    """A number of bytes: ``2GB``, ``512MB``, ``1.5GiB``, ``64KiB`` or plain bytes (decimal units are powers
    of 1000, binary ones of 1024), held as an int >= 1."""

    UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}

    def describe(self) -> str:
        return "a size in bytes, e.g. 2GB, 512MiB or 1000000"

    def parse(self, text: str) -> int:
        number = text.strip().rstrip("bBiIkKmMgGtT")
        unit = text.strip()[len(number) :].upper()
        try:
            size = int(float(number) * self.UNITS[unit])
        except (KeyError, ValueError, OverflowError):
            raise ValueError(f"must be {self.describe()}, got {text!r}") from None
        if not 1 <= size < 2**63:
            raise ValueError(f"must be {self.describe()} (at least 1 byte), got {text!r}")
        return size

    def invalid(self) -> list[str]:
        return ["", "GB", "2XB", "-1GB", "0", "nan", "1e400GB"]


class KeyValue(Text):
    """``KEY=VALUE``, the value read as JSON when it parses (numbers, true/false, null, lists), else a string."""

    def parse(self, text: str) -> tuple[str, object]:
        key, equals, value = text.partition("=")
        if not equals or not key:
            raise ValueError(f"must look like KEY=VALUE, got {text!r}")
        try:
            return key, json.loads(value)
        except json.JSONDecodeError:
            return key, value

    def invalid(self) -> list[str]:
        return ["", "no-equals-sign", "=1"]


def check_output_path(path: str | None, flag: str, directory: bool = False) -> None:
    """Fail before long work, not after it: the file or folder a result goes to must be writable.

    Nothing is left behind: the folder is probed by creating and removing a temporary folder in its
    nearest existing ancestor (as root, permission bits say nothing; read-only and virtual file
    systems still refuse)."""
    if path is None:
        return
    target = Path(path).expanduser()
    if directory and target.is_file():
        raise ValueError(f"{flag} {path!r} is a file; give a folder")
    if not directory and target.is_dir():
        raise ValueError(f"{flag} {path!r} is a directory; give a file name")
    check_writable(target if directory else target.parent, f"{flag} {path!r}")
