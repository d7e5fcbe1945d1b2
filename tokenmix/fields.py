"""Kinds of setting values, shared by the Python API and the command line.

A ``Kind`` (an integer in a range, a number, one of some names, a file to write, ...) does three
things with one definition of what it accepts:

- ``check(value, name)`` validates a Python value (a ``TrainConfig`` field), ValueError naming it;
- called on command-line text (as argparse's ``type``), it parses and checks it, so a bad value is
  refused while the arguments are read, in one line, before any work starts;
- ``invalid()`` lists texts it refuses, from which the test suite drives every option of every
  command with bad input (tests/test_cli_fuzz.py).

``setting(default, kind, help)`` declares a dataclass field carrying its kind and help line; the
command line builds its flags from them.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import field, fields
from pathlib import Path

UNWRITABLE_FOLDERS = ("/proc/tokenmix-no-such-folder", "/dev/null/inside-a-device")  # where nothing can be created


class Kind:
    """A kind of value; subclasses define ``describe``, ``parse`` and ``invalid`` (and ``check`` for Python values)."""

    optional = False  # None is accepted (a setting left unset)

    def describe(self) -> str:
        raise NotImplementedError

    def parse(self, text: str):
        """The value of command-line ``text``; ValueError (without the option's name) when it is not one."""
        return self.check(text, "the value")

    def check(self, value, name: str):
        """``value`` as this kind holds it; ValueError naming ``name`` otherwise."""
        raise NotImplementedError

    def invalid(self) -> list[str]:
        """Texts this kind refuses."""
        return [""]

    def listing(self) -> str:
        """What a help line adds to say which values there are ("" when its text says it)."""
        return ""

    def __call__(self, text: str):  # argparse's ``type``
        try:
            return self.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    def __repr__(self) -> str:  # argparse names the type in some messages
        return type(self).__name__.lower()


class Integer(Kind):
    """An integer in [minimum, maximum]; ``words`` are names it takes too (a TCN's ``dilation_factor="auto"``)."""

    def __init__(self, minimum: int = 1, maximum: int | None = None, optional: bool = False, words: tuple[str, ...] = ()):
        self.minimum, self.maximum, self.optional, self.words = minimum, maximum, optional, words

    def describe(self) -> str:
        number = f"an integer >= {self.minimum}" if self.maximum is None else f"an integer in [{self.minimum}, {self.maximum}]"
        return " or ".join([number, *(f'"{word}"' for word in self.words)])

    def parse(self, text: str) -> int | str:
        if text in self.words:
            return text
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be {self.describe()}, got {text!r}") from None
        return self._bounded(value, "", repr(text))

    def check(self, value, name: str):
        if (value is None and self.optional) or (isinstance(value, str) and value in self.words):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be {self.describe()}, got {value!r}")
        return self._bounded(value, f"{name} ", repr(value))

    def _bounded(self, value: int, prefix: str, shown: str) -> int:
        if value < self.minimum or (self.maximum is not None and value > self.maximum):
            raise ValueError(f"{prefix}must be {self.describe()}, got {shown}")
        return value

    def invalid(self) -> list[str]:
        texts = ["", "x", "1.5", str(self.minimum - 1)]
        return texts + ([str(self.maximum + 1)] if self.maximum is not None else [])


class Number(Kind):
    """A finite real number within optional bounds, open or closed."""

    def __init__(self, minimum=None, maximum=None, *, open_minimum=False, open_maximum=False, optional=False):
        self.minimum, self.maximum, self.open_minimum, self.open_maximum = minimum, maximum, open_minimum, open_maximum
        self.optional = optional

    def describe(self) -> str:
        low = None if self.minimum is None else f"{'>' if self.open_minimum else '>='} {self.minimum:g}"
        high = None if self.maximum is None else f"{'<' if self.open_maximum else '<='} {self.maximum:g}"
        bounds = " and ".join(part for part in (low, high) if part)
        return "a finite number" + (f" {bounds}" if bounds else "")

    def parse(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"must be {self.describe()}, got {text!r}") from None
        if not self._fits(value):
            raise ValueError(f"must be {self.describe()}, got {text!r}")
        return value

    def check(self, value, name: str):
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not self._fits(float(value)):
            raise ValueError(f"{name} must be {self.describe()}, got {value!r}")
        return float(value)

    def _fits(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.minimum is not None and (value <= self.minimum if self.open_minimum else value < self.minimum):
            return False
        return self.maximum is None or (value < self.maximum if self.open_maximum else value <= self.maximum)

    def invalid(self) -> list[str]:
        texts = ["", "x", "nan", "inf"]
        if self.minimum is not None:
            texts.append(f"{self.minimum:g}" if self.open_minimum else f"{self.minimum - 1:g}")
        if self.maximum is not None:
            texts.append(f"{self.maximum:g}" if self.open_maximum else f"{self.maximum + 1:g}")
        return texts


class Flag(Kind):
    """True or false (a Python bool; nothing else is read as one)."""

    def describe(self) -> str:
        return "true or false"

    def check(self, value, name: str):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value


class Pair(Kind):
    """Two integers >= 1, as a list (the form a JSON config holds), or None."""

    def __init__(self, what: str):
        self.what, self.optional = what, True

    def describe(self) -> str:
        return f"two positive integers ({self.what})"

    def check(self, value, name: str):
        if value is None:
            return None
        pair = isinstance(value, (list, tuple)) and len(value) == 2
        if not pair or any(isinstance(size, bool) or not isinstance(size, int) or size < 1 for size in value):
            raise ValueError(f"{name} must be None or {self.describe()}, got {value!r}")
        return [int(size) for size in value]


class Choice(Kind):
    """One of some names (``names``: a list, or a function giving it, for registries filled at import)."""

    def __init__(self, names: Iterable[str] | Callable[[], Iterable[str]], optional: bool = False, listed: bool = True):
        self._names, self.optional, self.listed = names, optional, listed

    @property
    def names(self) -> list[str]:
        return list(self._names() if callable(self._names) else self._names)

    def describe(self) -> str:
        return f"one of {', '.join(self.names)}"

    def check(self, value, name: str):
        if value is None and self.optional:
            return None
        if not isinstance(value, str) or value not in self.names:
            raise ValueError(f"{name} must be one of {self.names}, got {value!r}")
        return value

    def parse(self, text: str) -> str:
        if text not in self.names:
            raise ValueError(f"must be one of {', '.join(self.names)}, got {text!r}")
        return text

    def invalid(self) -> list[str]:
        return ["", "no-such-name"]

    def listing(self) -> str:
        return f": {', '.join(self.names)}" if self.listed else ""


class Names(Choice):
    """Comma-separated names, each one of ``names``."""

    def describe(self) -> str:
        return f"comma-separated names among {', '.join(self.names)}"

    def parse(self, text: str) -> list[str]:
        chosen = [part.strip() for part in text.split(",") if part.strip()]
        unknown = [name for name in chosen if name not in self.names]
        if not chosen or unknown:
            raise ValueError(f"must be {self.describe()}, got {text!r}")
        return chosen

    def invalid(self) -> list[str]:
        return ["", ",", "no-such-name", f"{self.names[0]},no-such-name"]


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


class Cpus(Kind):
    """CPU numbers this process may run on (its affinity mask, Linux), comma-separated, ranges allowed: ``0,1`` or ``0-3,8``."""

    def describe(self) -> str:
        return "comma-separated CPU numbers or ranges (0-3,8) among those this process may use"

    def parse(self, text: str) -> list[int]:
        from .runtime import usable_cpus

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


class Text(Kind):
    """Any text but the empty one."""

    def __init__(self, what: str = "a text", optional: bool = False):
        self.what, self.optional = what, optional

    def describe(self) -> str:
        return self.what

    def check(self, value, name: str):
        if value is None and self.optional:
            return None
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be {self.what} (not empty), got {value!r}")
        return value

    def parse(self, text: str) -> str:
        if not text:
            raise ValueError(f"must be {self.what}, not empty")
        return text


class Parsed(Text):
    """Text read by a function that raises ValueError for what it refuses (the tokenizer spec, a time interval)."""

    def __init__(self, what: str, reader: Callable[[str], object], invalid: list[str], optional: bool = False):
        super().__init__(what, optional)
        self.reader, self._invalid = reader, invalid

    def check(self, value, name: str):
        value = super().check(value, name)
        if value is not None:
            try:
                self.reader(value)
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None
        return value

    def parse(self, text: str) -> str:
        self.reader(super().parse(text))
        return text

    def invalid(self) -> list[str]:
        return ["", *self._invalid]


class Existing(Text):
    """A path that must exist (a run directory, a checkpoint, an export, a JSON file)."""

    def parse(self, text: str) -> str:
        if not Path(super().parse(text)).expanduser().exists():
            raise ValueError(f"{text!r} does not exist (give {self.what})")
        return text

    def invalid(self) -> list[str]:
        return ["", "/no/such/path"]


class Output(Text):
    """A file (``folder=False``) or folder to write; whether it can be written is checked before the
    work starts (``check_output_path``), as creating it while arguments are read would leave it
    behind when another argument is refused."""

    def __init__(self, what: str, folder: bool, optional: bool = False):
        super().__init__(what, optional)
        self.folder = folder

    def invalid(self) -> list[str]:
        return ["", *(folder if self.folder else f"{folder}/out.json" for folder in UNWRITABLE_FOLDERS)]


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


def check_writable(folder: Path, what: str) -> None:
    """ValueError naming ``what`` unless ``folder`` exists as a writable folder or could be created."""
    import tempfile

    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    try:
        if not ancestor.is_dir():
            raise NotADirectoryError(f"{ancestor} is not a folder")
        Path(tempfile.mkdtemp(dir=ancestor, prefix=".tokenmix-probe-")).rmdir()
    except OSError as error:
        raise ValueError(f"{what}: cannot be written ({error.strerror or error})") from None


def setting(default, kind: Kind | None, help: str, *, factory: Callable[[], object] | None = None):
    """A dataclass field with its ``kind`` (None: a flag or a structured value) and one-line ``help``;
    ``factory`` makes a mutable default (then ``default`` is ignored)."""
    metadata = {"kind": kind, "help": help}
    return field(default_factory=factory, metadata=metadata) if factory else field(default=default, metadata=metadata)


def check_settings(instance) -> None:
    """Check every field of a dataclass of ``setting`` fields against its kind (the field's name in messages)."""
    for spec in fields(instance):
        kind = spec.metadata.get("kind")
        if kind is not None:
            setattr(instance, spec.name, kind.check(getattr(instance, spec.name), spec.name))
