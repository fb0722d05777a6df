"""paramiko, imported without `invoke` until an ssh config's `Match exec` needs it.

paramiko.config imports `invoke` (when installed) only to run `Match exec` commands; that import
is ~45 ms of every launch's critical path before the first connection. Here paramiko is imported
with `invoke` held back, and paramiko.config is given a stand-in that imports the real `invoke`
the first time a `Match exec` line is evaluated. Import paramiko from here.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


class LazyInvoke:
    """Stands for the `invoke` module in paramiko.config; imports it on first use."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("invoke"), name)


_HELD_BACK = "invoke" not in sys.modules
if _HELD_BACK:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` -> ImportError
try:
    import paramiko as paramiko  # after holding back invoke
    import paramiko.config
finally:
    if _HELD_BACK and "invoke" in sys.modules and sys.modules["invoke"] is None:
        del sys.modules["invoke"]
if getattr(paramiko.config, "invoke", 0) is None:
    setattr(paramiko.config, "invoke", LazyInvoke())  # noqa: B010 - not in paramiko's stubs
