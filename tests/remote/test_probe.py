"""The probe's package listing, under a real interpreter, against importlib.metadata's own view."""

from __future__ import annotations

import os
import sys
from importlib import metadata

from dtrain.remote import probe


def test_the_listed_distributions_are_what_importlib_metadata_reports() -> None:
    found = probe.interpreter(sys.executable, os.getcwd())
    assert found.get("error") is None, found
    expected: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name not in expected:
            expected[name] = dist.version
    assert found["distributions"] == expected
    assert "paramiko" in found["distributions"]
