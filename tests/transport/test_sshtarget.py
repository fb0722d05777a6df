"""How one ProxyJump hop reads: `[user@]host[:port]`, an IPv6 address in brackets, as OpenSSH.

Resolving whole targets through `ssh -G` is tested in test_ssh.py.
"""

from __future__ import annotations

import pytest

from dtrain.transport.sshtarget import split_jump_hop


@pytest.mark.parametrize(
    ("hop", "parts"),
    [
        ("bastion", ("", "bastion", "")),
        ("gate@bastion:2200", ("gate", "bastion", "2200")),
        ("[fd00::1]:2200", ("", "fd00::1", "2200")),
        ("me@[fd00::1]", ("me", "fd00::1", "")),
    ],
)
def test_proxy_jump_hops_split_like_openssh(hop: str, parts: tuple[str, str, str]) -> None:
    assert split_jump_hop(hop) == parts
