"""Reading formats that are pickles by nature (the CIFAR-10 python release) without running code.

Unpickling calls whatever callable the file names, so a crafted file runs any code it likes. This
unpickler resolves only the globals that rebuild a numpy array (numpy's ``_reconstruct``,
``_frombuffer``, ``ndarray`` and ``dtype``) and the Latin-1 encoding by which pickle protocols 0 to 2 of Python 3
spell bytes; dicts, lists, tuples, numbers and strings need none. Any other global is refused, and
the caller reports the file.
"""

from __future__ import annotations

import io
import pickle

import numpy as np

_RECONSTRUCT = np.zeros(1).__reduce__()[0]  # numpy's array rebuilders, wherever this numpy keeps them
_FROM_BUFFER = np.zeros(1).__reduce_ex__(5)[0]  # protocol 5's


def _latin1_bytes(text: str, encoding: str) -> bytes:
    """``_codecs.encode`` as protocols 0 to 2 use it for bytes, and nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"it calls _codecs.encode with {encoding!r}; only latin1 (how pickle spells bytes) is read")
    return text.encode("latin1")


_ALLOWED = {
    ("_codecs", "encode"): _latin1_bytes,
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,  # what numpy 1 (and the CIFAR-10 release) wrote
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,  # numpy 2
    ("numpy.core.numeric", "_frombuffer"): _FROM_BUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROM_BUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class RefusedPickle(pickle.UnpicklingError):
    """The file names a global outside numpy's array reconstruction."""


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise RefusedPickle(f"it names {module}.{name}, which could run code; only numpy arrays and plain containers are read")
        return _ALLOWED[module, name]


def load_arrays_pickle(data: bytes, encoding: str = "bytes"):
    """The value pickled in ``data``, built from plain containers and numpy arrays only.

    Raises ``pickle.UnpicklingError`` (``RefusedPickle`` for a disallowed global) or EOFError for bad data.
    """
    try:
        return _ArraysOnly(io.BytesIO(data), encoding=encoding).load()
    except (pickle.UnpicklingError, EOFError):
        raise
    except Exception as error:  # noqa: BLE001 - opcodes applied to the wrong objects (APPENDS on a dict, ...): bad data
        raise pickle.UnpicklingError(f"it is not a well-formed pickle ({type(error).__name__}: {error})") from error
