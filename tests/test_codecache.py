"""The cache of dataclasses' compiled methods: records made through it are the records dataclasses
makes, the program's second run compiles none, and a file it cannot trust is never loaded."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain import codecache, usercache

PYTHON = sys.executable
SEED = 7


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[codecache.CodeCache]:
    """A cache on a file of its own, as dataclasses' exec for the test only."""
    made = codecache.CodeCache(str(tmp_path / "records.bin"), {})
    monkeypatch.setattr(dataclasses, "exec", made.exec, raising=False)
    yield made


FLAGS = st.fixed_dictionaries(
    {
        "frozen": st.booleans(),
        "eq": st.booleans(),
        "order": st.booleans(),
        "unsafe_hash": st.booleans(),
        "kw_only": st.booleans(),
        "slots": st.booleans(),
    }
).filter(lambda f: f["eq"] or not f["order"])
NAMES = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), min_size=0, max_size=6)


def make(names: list[str], flags: dict[str, bool]) -> type:
    fields: list[Any] = []
    for i, name in enumerate(dict.fromkeys(names)):
        if i % 3 == 0:
            fields.append((f"f_{name}", int))
        elif i % 3 == 1:
            fields.append((f"f_{name}", "str", dataclasses.field(default="x")))
        else:
            fields.append((f"f_{name}", list[int], dataclasses.field(default_factory=list)))
    # a field without a default after one with it needs kw_only: otherwise give every field one
    if not flags["kw_only"]:
        fields = [(f[0], f[1], dataclasses.field(default=0)) if len(f) == 2 else f for f in fields]
    options: dict[str, Any] = dict(flags)
    return dataclasses.make_dataclass("Rec", fields, **options)


def behaviour(cls: type) -> dict[str, Any]:
    """What a record class does, as data that two classes can be compared by."""
    names = [f.name for f in dataclasses.fields(cls)]
    one, two = cls(**{n: 1 for n in names}), cls(**{n: 1 for n in names})
    other = cls(**{n: 2 for n in names})
    seen: dict[str, Any] = {
        "repr": repr(one).replace(cls.__qualname__, "Rec"),
        "eq": one == two,
        "ne": one == other,
        "signature": str(inspect.signature(cls)),
        "annotations": {k: str(v) for k, v in vars(cls)["__init__"].__annotations__.items()},
        "methods": sorted(k for k in vars(cls) if k.startswith("__") and callable(vars(cls)[k])),
    }
    try:
        seen["hash"] = hash(one) == hash(two)
    except TypeError as exc:
        seen["hash"] = str(exc)
    try:
        setattr(one, names[0] if names else "x", 3)
        seen["assign"] = "ok"
    except (AttributeError, TypeError) as exc:  # frozen; slots; 3.11 frozen+slots: TypeError
        seen["assign"] = type(exc).__name__
    return seen


@settings(max_examples=60, deadline=None)
@given(names=NAMES, flags=FLAGS)
def test_a_record_made_through_the_cache_is_the_record_dataclasses_makes(
    names: list[str], flags: dict[str, bool]
) -> None:
    plain = behaviour(make(names, flags))
    made = codecache.CodeCache(None, {})
    original = dataclasses.__dict__.get("exec")
    setattr(dataclasses, "exec", made.exec)  # noqa: B010 - as install() does
    try:
        cold = behaviour(make(names, flags))
        warm = behaviour(make(names, flags))  # every method from the cache now
    finally:
        if original is None:
            del dataclasses.exec  # type: ignore[attr-defined]
        else:
            setattr(dataclasses, "exec", original)  # noqa: B010
    assert cold == plain
    assert warm == plain
    assert made.compiled == len(made.used)  # the second class compiled nothing


def test_the_cached_code_is_compiled_as_exec_compiles_it(cache: codecache.CodeCache) -> None:
    """No __future__ flag of codecache's own reaches the records: annotations stay objects."""

    point = dataclasses.make_dataclass("Point", [("x", int), ("y", float, 0.5)], frozen=True)
    init = vars(point)["__init__"]
    assert init.__annotations__ == {"x": int, "y": float, "return": None}
    assert init.__code__.co_filename == "<string>"
    assert cache.compiled == len(cache.used) > 0


def test_exec_without_namespaces_uses_the_callers_as_exec_does(
    cache: codecache.CodeCache,
) -> None:
    namespace: dict[str, Any] = {"seed": 20}
    cache.exec("grown = seed + 1", namespace)
    assert namespace["grown"] == 21
    cache.exec(compile("grown += 1", "<t>", "exec"), namespace)  # code passes straight through
    assert namespace["grown"] == 22
    mine: dict[str, Any] = {}
    cache.exec("doubled = SEED * 2", None, mine)  # this module's globals, as exec's caller's
    assert mine == {"doubled": 2 * SEED}


def test_a_saved_cache_answers_every_compile_of_the_next_run(
    cache: codecache.CodeCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = lambda: dataclasses.make_dataclass("R", [("a", int), ("b", str)], frozen=True)  # noqa: E731
    record()
    assert cache.compiled > 0
    assert cache.save()
    again = codecache.CodeCache(cache.path, codecache.decode(Path(str(cache.path)).read_bytes()))
    monkeypatch.setattr(dataclasses, "exec", again.exec)
    record()
    assert again.compiled == 0
    assert again.used == cache.used
    assert not again.save()  # nothing new: the file is left as it is
    assert oct(os.stat(str(cache.path)).st_mode & 0o777) == "0o600"


def test_past_its_limit_a_rewrite_keeps_only_what_the_run_used(
    cache: codecache.CodeCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = {f"x{i} = {i}": compile(f"x{i} = {i}", "<string>", "exec") for i in range(10)}
    cache.codes.update(old)
    monkeypatch.setattr(codecache, "MAX_TEXTS", 5)
    dataclasses.make_dataclass("R", [("a", int)])
    assert cache.save()
    kept = codecache.decode(Path(str(cache.path)).read_bytes())
    assert set(kept) == cache.used
    assert not set(kept) & set(old)


def good_file() -> bytes:
    codes = {"a = 1": compile("a = 1", "<string>", "exec")}
    data = codecache.encode(codes)
    assert codecache.decode(data).keys() == codes.keys()
    return data


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda d: d[:-7], id="torn"),
        pytest.param(lambda d: d[:40] + bytes([d[40] ^ 1]) + d[41:], id="one-bit-changed"),
        pytest.param(lambda d: b"", id="empty"),
        pytest.param(lambda d: d[:4], id="checksum-only"),
        pytest.param(lambda d: d[4:], id="no-checksum"),
    ],
)
def test_a_file_that_is_not_what_was_written_is_never_loaded(
    tmp_path: Path, spoil: Callable[[bytes], bytes]
) -> None:
    assert codecache.decode(spoil(good_file())) == {}


@pytest.mark.parametrize(
    "content",
    [[1, 2], {"a = 1": "not code"}, {1: compile("a = 1", "<s>", "exec")}, "text"],
    ids=["a-list", "text-for-code", "number-key", "a-string"],
)
def test_a_checksummed_file_of_anything_but_text_to_code_is_not_loaded(
    content: Any,
) -> None:
    import marshal

    body = marshal.dumps(content)
    assert codecache.decode(codecache.checksum(body) + body) == {}


def test_a_file_others_may_write_or_reached_through_a_link_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "records.bin"
    path.write_bytes(good_file())
    path.chmod(0o600)
    assert usercache.read(str(path), 1 << 20) is not None
    path.chmod(0o620)
    assert usercache.read(str(path), 1 << 20) is None
    path.chmod(0o600)
    link = tmp_path / "link.bin"
    link.symlink_to(path)
    assert usercache.read(str(link), 1 << 20) is None
    assert usercache.read(str(path), 10) is None  # larger than asked for


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_a_file_of_another_user_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "records.bin"
    path.write_bytes(good_file())
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    assert usercache.read(str(path), 1 << 20) is None


def test_the_folder_is_private_or_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    made = usercache.folder()
    assert made == str(tmp_path / "cache" / "dtrain")
    assert oct(os.stat(made).st_mode & 0o777) == "0o700"
    os.chmod(made, 0o770)
    assert usercache.folder() is None
    os.chmod(made, 0o700)
    (tmp_path / "cache").rename(tmp_path / "elsewhere")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "dtrain").symlink_to(tmp_path / "elsewhere" / "dtrain")
    assert usercache.folder() is None


def test_writers_at_once_leave_a_whole_file_for_every_reader(tmp_path: Path) -> None:
    """Each write is renamed into place: a reader sees one whole file, never a mix."""
    path = str(tmp_path / "records.bin")
    files = [
        codecache.encode({f"v = {k}" * 200: compile(f"v = {k}", "<string>", "exec")})
        for k in range(4)
    ]
    stop = threading.Event()
    seen: list[bool] = []

    def writer(data: bytes) -> None:
        for _ in range(50):
            usercache.write(path, data)

    def reader() -> None:
        while not stop.is_set() and len(seen) < 2000:
            data = usercache.read(path, 1 << 20)
            if data is not None:
                seen.append(bool(codecache.decode(data)))

    readers = [threading.Thread(target=reader) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(d,)) for d in files]
    for t in [*readers, *writers]:
        t.start()
    for t in writers:
        t.join(timeout=30)
    stop.set()
    for t in readers:
        t.join(timeout=30)
    assert seen and all(seen)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def program_run(cache_home: Path) -> dict[str, Any]:
    """What the program's start compiles, in a fresh interpreter, as `python -m dtrain` starts."""
    code = (
        "import json, sys\n"
        "from dtrain import codecache\n"
        "made = codecache.install()\n"
        "import dtrain.cli, dtrain.launch.lifecycle, dtrain.transport.ssh, dtrain.agents.ops\n"
        "import dtrain.launch.supervise, dtrain.doctor.gather\n"
        "saved = made.save()\n"
        "print(json.dumps({'compiled': made.compiled, 'used': len(made.used), 'saved': saved,"
        " 'path': made.path}))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    out = subprocess.run(
        [PYTHON, "-c", code], capture_output=True, text=True, check=True, env=env, timeout=60
    )
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def test_the_programs_second_start_compiles_no_record(tmp_path: Path) -> None:
    first = program_run(tmp_path / "cache")
    assert first["compiled"] == first["used"] > 100  # every method of dtrain's records
    assert first["saved"]
    assert first["path"].startswith(str(tmp_path / "cache" / "dtrain" / "records-"))
    second = program_run(tmp_path / "cache")
    assert second == {**first, "compiled": 0, "saved": False}


def test_the_dtrain_program_keeps_the_cache_and_a_library_import_does_not(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    folder = tmp_path / "cache" / "dtrain"
    subprocess.run(
        [PYTHON, "-c", "import dtrain.cli, dtrain.launch.lifecycle"], env=env, check=True
    )
    assert not folder.exists() or not any(folder.glob("records-*"))
    out = subprocess.run(
        [PYTHON, "-m", "dtrain", "--version"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert [p.name.startswith("records-") for p in folder.iterdir()] == [True]


def test_debug_says_where_the_records_methods_came_from(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    argv = [PYTHON, "-m", "dtrain", "--debug", "launch", "--dry-run", "-n", "1"]
    argv += ["--framework", "torch", "--log-dir", str(tmp_path / "logs"), "--", "true"]
    said = []
    for _ in range(2):
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        said.append([line for line in out.stderr.splitlines() if "record methods:" in line])
    assert [len(lines) for lines in said] == [1, 1]
    assert said[0][0].endswith(" compiled and kept")
    assert " 0 from " in said[0][0]
    assert said[1][0].endswith(", 0 compiled")


def test_an_unusable_cache_folder_leaves_the_program_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("a file where the folder would be\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run(
        [PYTHON, "-m", "dtrain", "--version"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert "dtrain, version" in out.stdout
