"""paramiko without `invoke` or `importlib.metadata` on the launch path, and `Match exec` still
working; the channel buffer and the socket's read-ahead hand on the stream as it was sent."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


def test_importing_the_ssh_transport_does_not_import_invoke() -> None:
    code = "import sys, dtrain.transport.ssh; print('invoke' in sys.modules)"
    assert run_python(code) == "False"


def test_match_exec_imports_invoke_when_evaluated() -> None:
    pytest.importorskip("invoke")
    code = (
        "import sys\n"
        "from dtrain.transport.sshlib import paramiko\n"
        "text = 'Match exec \"true\"\\n  User yes\\nHost *\\n  Port 2\\n'\n"
        "c = paramiko.SSHConfig.from_text(text)\n"
        "print(c.lookup('h')['user'], 'invoke' in sys.modules)\n"
    )
    assert run_python(code) == "yes True"


def test_the_channel_buffer_hands_out_bytes_in_order_then_end_of_stream() -> None:
    from dtrain.transport.sshlib import ByteQueue, paramiko

    buffer = ByteQueue()
    with pytest.raises(paramiko.buffered_pipe.PipeTimeout):
        buffer.read(10, timeout=0.0)
    buffer.feed(b"0123456789")
    buffer.feed(b"abc")
    assert len(buffer) == 13
    assert buffer.read(4) == b"0123"
    assert buffer.read(9) == b"456789abc"
    assert not buffer.read_ready()
    buffer.feed(b"tail")
    assert buffer.read(100, timeout=0.05) == b"tail"  # what there is, once the time is up
    buffer.feed(b"end")
    buffer.close()
    assert buffer.read(100) == b"end"
    assert buffer.read(100) == b""


def test_a_read_waits_for_all_it_asked_for() -> None:
    import threading

    from dtrain.transport.sshlib import ByteQueue

    buffer = ByteQueue()

    def feed() -> None:
        for _ in range(100):
            buffer.feed(b"x" * 1000)

    feeder = threading.Thread(target=feed)
    feeder.start()
    assert buffer.read(100_000, timeout=30) == b"x" * 100_000
    feeder.join()


def test_paramiko_knows_its_version_without_importlib_metadata_on_the_launch_path() -> None:
    code = (
        "import sys, dtrain.transport.ssh\n"
        "from dtrain.transport.sshlib import paramiko\n"
        "held_back = 'importlib.metadata' not in sys.modules\n"
        "from importlib import metadata\n"
        "print(held_back, paramiko.__version__ == metadata.version('paramiko'))\n"
    )
    assert run_python(code) == "True True"


def test_versions_agree_with_importlib_metadata_and_an_unknown_name_raises_as_it_does() -> None:
    from importlib import metadata

    from dtrain.transport.sshlib import distribution_version

    assert distribution_version("pytest") == metadata.version("pytest")
    with pytest.raises(metadata.PackageNotFoundError):
        distribution_version("no-such-distribution-here")


def test_the_stand_in_hands_anything_but_version_to_the_real_importlib_metadata() -> None:
    code = (
        "import sys\n"
        "from dtrain.transport import sshlib\n"
        "sys.modules['importlib.metadata'] = sshlib.METADATA_STAND_IN\n"
        "from importlib import metadata\n"
        "found = metadata.distribution('paramiko').metadata['Name']\n"
        "print(found, sys.modules['importlib.metadata'] is not sshlib.METADATA_STAND_IN)\n"
    )
    assert run_python(code) == "paramiko True"


@given(
    feeds=st.lists(st.binary(max_size=300), max_size=20),
    reads=st.lists(st.integers(min_value=1, max_value=400), max_size=30),
)
def test_the_channel_buffer_hands_out_what_was_fed_whatever_the_packet_and_read_sizes(
    feeds: list[bytes], reads: list[int]
) -> None:
    from dtrain.transport.sshlib import ByteQueue

    buffer = ByteQueue()
    for data in feeds:
        buffer.feed(data)
    buffer.close()  # a read returns what there is, never waits
    fed = b"".join(feeds)
    out = [buffer.read(size) for size in reads]
    assert all(len(part) == min(size, len(fed) - sum(map(len, out[:i])))
               for i, (part, size) in enumerate(zip(out, reads, strict=True)))  # fmt: skip
    rest = buffer.empty()
    assert b"".join(out) + rest == fed
    assert len(buffer) == 0 and not buffer.read_ready()


@given(
    pieces=st.lists(st.binary(min_size=1, max_size=3000), max_size=40),
    reads=st.lists(st.integers(min_value=1, max_value=5000), max_size=60),
)
@settings(max_examples=50, deadline=None)
def test_read_ahead_hands_paramiko_the_stream_as_sent_whatever_it_asks_for(
    pieces: list[bytes], reads: list[int]
) -> None:
    """ReadAhead takes up to 256 KB per recv from the socket and serves the packetizer's reads
    from that: every byte in order, never more than asked, and the socket's timeout as ever."""
    import socket

    from dtrain.transport.sshlib import ReadAhead

    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(0.05)
        reader = ReadAhead(ours)
        reader.SIZE = 1000  # small, so reads cross its refills
        sent = b"".join(pieces)
        theirs.sendall(sent)
        got = b""
        for size in reads:
            if len(got) == len(sent):
                break
            part = reader.recv(size)
            assert 0 < len(part) <= size
            got += part
        while len(got) < len(sent):
            got += reader.recv(4096)
        assert got == sent
        with pytest.raises(TimeoutError):  # socket.timeout: paramiko retries on it
            reader.recv(10)
        theirs.close()
        assert reader.recv(10) == b""  # end of stream
