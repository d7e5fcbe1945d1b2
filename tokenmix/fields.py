"""Kinds of setting values: what a setting accepts, defined once for Python values and for text.

A ``Kind`` (an integer in a range, a number, one of some names, a file to write, ...) says:

- ``check(value, name)``: a Python value it holds (an option, a ``TrainConfig`` field), else a
  ValueError naming it;
- ``parse(text)``: the value of its text form, else a ValueError (the command line reads its flags
  by it, ``tokenmix.cli.arguments``);
- ``describe()`` and ``listing()``: what it accepts, for help lines and docs/options.md;
- ``invalid()``: texts it refuses, from which the test suite drives every option of every command
  with bad input (tests/cli/test_cli_fuzz.py).

``setting(default, kind, help)`` declares a dataclass field carrying its kind and help line; option
dataclasses (``tokenmix.options``) and ``TrainConfig`` are made of them.
"""

from __future__ import annotations

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
    """Comma-separated names, each one of ``names``; in Python a list of them (or that text)."""

    def describe(self) -> str:
        return f"comma-separated names among {', '.join(self.names)}"

    def parse(self, text: str) -> list[str]:
        chosen = [part.strip() for part in text.split(",") if part.strip()]
        unknown = [name for name in chosen if name not in self.names]
        if not chosen or unknown:
            raise ValueError(f"must be {self.describe()}, got {text!r}")
        return chosen

    def check(self, value, name: str):
        if value is None and self.optional:
            return None
        if isinstance(value, str):
            try:
                value = self.parse(value)
            except ValueError as error:
                raise ValueError(f"{name} {error}") from None
        if not isinstance(value, (list, tuple)) or any(not isinstance(item, str) or item not in self.names for item in value):
            raise ValueError(f"{name} must be a list of names among {', '.join(self.names)}, got {value!r}")
        return list(dict.fromkeys(value))  # each once, in the order given

    def invalid(self) -> list[str]:
        return ["", ",", "no-such-name", f"{self.names[0]},no-such-name"]


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
    work starts (``tokenmix.cli.arguments.check_output_path``), as creating it while arguments are read would leave it
    behind when another argument is refused."""

    def __init__(self, what: str, folder: bool, optional: bool = False):
        super().__init__(what, optional)
        self.folder = folder

    def invalid(self) -> list[str]:
        return ["", *(folder if self.folder else f"{folder}/out.json" for folder in UNWRITABLE_FOLDERS)]


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


def setting_fields(cls_or_instance) -> list:
    """The fields of a dataclass declared with ``setting`` (an options dataclass's own options)."""
    return [spec for spec in fields(cls_or_instance) if "kind" in spec.metadata]


def check_settings(instance) -> None:
    """Check every setting of a dataclass against its kind (the field's name in messages)."""
    for spec in setting_fields(instance):
        kind = spec.metadata["kind"]
        if kind is not None:
            setattr(instance, spec.name, kind.check(getattr(instance, spec.name), spec.name))
