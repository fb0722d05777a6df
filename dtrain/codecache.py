"""The compiled code of the methods `dataclasses` writes for dtrain's records, kept between runs.

dataclasses writes each record's `__init__`, `__repr__`, `__eq__`, `__hash__` (and a frozen one's
`__setattr__` and `__delattr__`) as source text and compiles it every time the class is made,
which no .pyc keeps: a launch makes ~50 records, ~270 compiles, 45-55 ms of its CPU on this
machine (a fifth of its imports), before its first connection and while the agents boot. The
`dtrain` program (not a program that imports dtrain) answers those compiles from a file in the
user's cache folder: for each text, the code object `exec` compiles from it, stored with
marshal under the interpreter's bytecode magic number and behind a checksum, so a torn or
damaged file is never loaded. A text the file lacks is compiled as before, and the file is
rewritten when the program ends. What runs is what dataclasses would have run: the same text
compiled the same way, only not compiled again. Loading it takes ~5 ms a start; `--debug` says
how many methods came from it.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import marshal
import os
import sys
import threading
import zlib
from collections.abc import Mapping
from types import CodeType
from typing import Any

from dtrain import usercache

logger = logging.getLogger(__name__)

MAX_FILE_BYTES = 8 << 20
MAX_TEXTS = 1024  # ~1 MB; past it (older dtrains' texts), a rewrite keeps what its run used
CHECKSUM_BYTES = 4


def checksum(data: bytes) -> bytes:
    """CRC-32: a torn or damaged file is never loaded (marshal trusts what it reads). A digest
    could not stop a deliberate change either, by whoever may write the user's private folder:
    the user, who could change dtrain itself. SHA-256 took 2.5 ms a start here."""
    return zlib.crc32(data).to_bytes(CHECKSUM_BYTES, "big")


def cache_file() -> str | None:
    """This interpreter's file in the user's cache folder; None without one (or on an
    interpreter that keeps no bytecode)."""
    tag = sys.implementation.cache_tag
    folder = usercache.folder() if tag else None
    if folder is None:
        return None
    from importlib.util import MAGIC_NUMBER

    return os.path.join(folder, f"records-{tag}-{MAGIC_NUMBER.hex()}.bin")


def decode(data: bytes | None) -> dict[str, CodeType]:
    """The texts and their code in a cache file's bytes; empty unless the checksum matches and
    the content is exactly a dict of text to code."""
    if data is None or len(data) <= CHECKSUM_BYTES:
        return {}
    body = data[CHECKSUM_BYTES:]
    if checksum(body) != data[:CHECKSUM_BYTES]:
        return {}
    try:
        codes = marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        return {}
    if type(codes) is not dict:
        return {}
    if not all(type(k) is str and type(v) is CodeType for k, v in codes.items()):
        return {}
    return codes


def encode(codes: Mapping[str, CodeType]) -> bytes:
    body = marshal.dumps(dict(codes))
    return checksum(body) + body


class CodeCache:
    """`exec` for dataclasses: a text's code from the cache, compiled (and kept) if missing."""

    def __init__(self, path: str | None, codes: dict[str, CodeType]) -> None:
        self.path = path
        self.codes = codes
        self.used: set[str] = set()
        self.compiled = 0
        self._lock = threading.Lock()  # the launch imports in a thread too

    def exec(  # builtins.exec's own parameters
        self,
        source: Any,
        globals: dict[str, Any] | None = None,
        locals: Mapping[str, object] | None = None,
        /,
        **kwargs: Any,
    ) -> None:
        if globals is None:  # as exec does: the caller's namespaces, not this module's
            caller = sys._getframe(1)
            globals = caller.f_globals
            locals = caller.f_locals if locals is None else locals
        if type(source) is str:
            code = self.codes.get(source)
            if code is None:
                # exec's own compile: "<string>", no __future__ flags (this module's would leak)
                code = compile(source, "<string>", "exec", dont_inherit=True)
                with self._lock:
                    self.codes[source] = code
                    self.compiled += 1
            self.used.add(source)
            source = code
        builtins.exec(source, globals, locals, **kwargs)

    def save(self) -> bool:
        """Rewrite the file when this run compiled what it did not hold; whether it was."""
        if not self.compiled or self.path is None:
            return False
        with self._lock:
            if len(self.codes) > MAX_TEXTS:  # texts of older dtrains: keep what is in use
                keep = {text: self.codes[text] for text in self.used}
            else:
                keep = dict(self.codes)
        try:
            usercache.write(self.path, encode(keep))
        except OSError:
            return False  # the next run compiles again
        return True


_active: CodeCache | None = None


def install() -> CodeCache:
    """From now on, dataclasses in this process compile through the cache (once per process)."""
    global _active
    if _active is None:
        where = cache_file()
        _active = CodeCache(where, decode(usercache.read(where, MAX_FILE_BYTES)) if where else {})
        setattr(dataclasses, "exec", _active.exec)  # noqa: B010 - shadows the builtin there
    return _active


def save() -> None:
    """At the program's end: keep what this run compiled for the next one (if installed)."""
    if _active is None:
        return
    kept = _active.save()
    logger.debug(
        "record methods: %d from %s, %d compiled%s",
        len(_active.used) - _active.compiled,
        _active.path or "no cache file",
        _active.compiled,
        " and kept" if kept else "",
    )
