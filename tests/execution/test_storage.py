"""Tests of ray_stagetree.execution.storage: payload packing, durable storage, eviction accounting."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import posixpath
import tarfile
import uuid

import fsspec
import pyarrow.fs as pafs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_stagetree.execution.payload import checksum, pack_directory, unpack_directory
from ray_stagetree.execution.storage import (
    CheckpointCache,
    CheckpointCorruptError,
    CheckpointMissingError,
    CheckpointStorage,
    CheckpointUnavailableError,
    StoredCheckpoint,
)

# ---------------------------------------------------------------- payloads


def _make_tree(root) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "model.pt").write_bytes(os.urandom(1000))
    (root / "sub" / "state.json").write_text('{"step": 3}')
    (root / "sub" / "deeper" / "z.bin").write_bytes(b"\x00" * 10)


def _snapshot(root) -> dict[str, bytes | None]:
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            result[os.path.relpath(os.path.join(dirpath, name), root)] = None
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as handle:
                result[os.path.relpath(full, root)] = handle.read()
    return result


def test_pack_unpack_round_trip(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    _make_tree(source)
    data = pack_directory(str(source))
    target = tmp_path / "target"
    unpack_directory(data, str(target))
    assert _snapshot(target) == _snapshot(source)
    assert (target / "empty").is_dir()


def test_pack_is_deterministic(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    _make_tree(first)
    data = pack_directory(str(first))
    unpack_directory(data, str(second))
    os.utime(second / "model.pt", (1, 1))
    assert pack_directory(str(second)) == data
    assert checksum(pack_directory(str(second))) == checksum(data)
    names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
    assert names == sorted(names, key=lambda n: n.split("/"))


def test_pack_empty_directory(tmp_path):
    data = pack_directory(str(tmp_path))
    unpack_directory(data, str(tmp_path / "out"))
    assert os.listdir(tmp_path / "out") == []


def test_pack_refuses_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        pack_directory(str(tmp_path / "file"))


def test_pack_follows_links_as_tunes_upload_does(tmp_path):
    """A checkpoint that links its weights from elsewhere is packed whole:
    Tune's upload (pyarrow's copy_files) copies what a link points to, and
    refusing it lost the trial's checkpoint (issue 30 point 4)."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "shards").mkdir(parents=True)
    (elsewhere / "weights.bin").write_bytes(b"w" * 10)
    (elsewhere / "shards" / "0.bin").write_bytes(b"s")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model.txt").write_text("m")
    (checkpoint / "weights.bin").symlink_to(elsewhere / "weights.bin")
    (checkpoint / "shards").symlink_to("../elsewhere/shards")  # relative, to a folder
    data = pack_directory(str(checkpoint))
    members = tarfile.open(fileobj=io.BytesIO(data)).getmembers()
    assert not any(member.issym() or member.islnk() for member in members)
    target = tmp_path / "target"
    unpack_directory(data, str(target))
    assert _snapshot(target) == {"model.txt": b"m", "weights.bin": b"w" * 10, "shards": None, "shards/0.bin": b"s"}
    assert not (target / "weights.bin").is_symlink()


@pytest.mark.parametrize(
    "make, named",
    [
        (
            lambda folder: (folder / "gone").symlink_to(folder / "missing"),
            "'gone' is a symbolic link to .*missing.*does not exist",
        ),
        (
            lambda folder: (folder / "sub").mkdir() or (folder / "sub" / "up").symlink_to(".."),
            "'sub/up' is a symbolic link to '..'.*a cycle",
        ),
        (lambda folder: os.mkfifo(folder / "pipe"), "'pipe' is a special file"),
    ],
    ids=["broken link", "link cycle", "fifo"],
)
def test_pack_refuses_what_cannot_be_copied_naming_it(tmp_path, make, named):
    make(tmp_path)
    with pytest.raises(ValueError, match=f"cannot pack '{tmp_path}': {named}"):
        pack_directory(str(tmp_path))


def _archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, content in members:
            if content is not None:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
            else:
                archive.addfile(info)
    return buffer.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.mark.parametrize(
    "member, message",
    [
        ((_info("/etc/evil"), b"x"), "absolute path"),
        ((_info("../evil"), b"x"), r"leaves the target directory"),
        ((_info("a/../../evil"), b"x"), r"leaves the target directory"),
        ((_info("link", tarfile.SYMTYPE, "/etc/passwd"), None), "is a link"),
        ((_info("hard", tarfile.LNKTYPE, "other"), None), "is a link"),
        ((_info("dev", tarfile.CHRTYPE), None), "device or special file"),
        ((_info("fifo", tarfile.FIFOTYPE), None), "device or special file"),
    ],
)
def test_unpack_rejects_unsafe_members(tmp_path, member, message):
    data = _archive((_info("ok.txt"), b"fine"), member)
    target = tmp_path / "target"
    with pytest.raises(ValueError, match=message):
        unpack_directory(data, str(target))
    assert not target.exists(), "nothing is written when any member is unsafe"
    assert not (tmp_path / "evil").exists()


def test_unpack_rejects_garbage(tmp_path):
    with pytest.raises(ValueError, match="not a tar archive"):
        unpack_directory(b"definitely not a tar archive" * 100, str(tmp_path / "x"))


def test_checksum_format():
    assert checksum(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert checksum(b"a") != checksum(b"b")


# ---------------------------------------------------------------- storage


def _flip_byte(storage: CheckpointStorage, stored: StoredCheckpoint) -> None:
    data = bytearray(storage.filesystem.cat_file(stored.path))
    data[len(data) // 2] ^= 0xFF
    storage.filesystem.pipe_file(stored.path, bytes(data))


@pytest.fixture(params=["local", "file_url", "memory", "arrow_local", "arrow_subtree", "fsspec_given"])
def storage(request, tmp_path) -> CheckpointStorage:
    kind = request.param
    if kind == "local":
        return CheckpointStorage(str(tmp_path / "exp"))
    if kind == "file_url":
        return CheckpointStorage(f"file://{tmp_path}/exp")
    if kind == "memory":
        root = f"memory://test-storage-{uuid.uuid4().hex}"
        memory = CheckpointStorage(root)
        request.addfinalizer(lambda: memory.filesystem.rm(memory.root, recursive=True))
        return memory
    if kind == "arrow_local":
        return CheckpointStorage(str(tmp_path / "exp"), pafs.LocalFileSystem())
    if kind == "arrow_subtree":
        return CheckpointStorage("exp", pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    if kind == "fsspec_given":
        return CheckpointStorage(str(tmp_path / "exp"), fsspec.filesystem("file"))
    raise AssertionError(kind)


def test_write_read_round_trip(storage):
    payload = os.urandom(5000)
    stored = storage.write("checkpoints/node000001_step0000010.ckpt", payload)
    assert stored.size_bytes == len(payload)
    assert stored.checksum == checksum(payload)
    assert stored.path.startswith(storage.root)
    assert stored.path.endswith("/checkpoints/node000001_step0000010.ckpt")
    assert storage.read(stored) == payload
    json.dumps(dataclasses.asdict(stored))
    # No temporary files are left beside the checkpoint.
    listing = storage.filesystem.ls(posixpath.dirname(stored.path), detail=False)
    assert [posixpath.basename(p.rstrip("/")) for p in listing] == ["node000001_step0000010.ckpt"]


def test_overwrite_and_empty_payload(storage):
    storage.write("a.ckpt", b"old")
    stored = storage.write("a.ckpt", b"")
    assert storage.read(stored) == b""


def test_corruption_is_detected(storage):
    stored = storage.write("c/x.ckpt", b"0123456789" * 100)
    _flip_byte(storage, stored)
    with pytest.raises(CheckpointCorruptError, match="checksum") as error:
        storage.read(stored)
    assert stored.path in str(error.value)
    assert isinstance(error.value, CheckpointUnavailableError)
    assert isinstance(error.value, RuntimeError)


def test_truncation_is_detected(storage):
    stored = storage.write("c/x.ckpt", b"0123456789" * 100)
    storage.filesystem.pipe_file(stored.path, b"0123")
    with pytest.raises(CheckpointCorruptError, match="expected 1000 bytes, found 4"):
        storage.read(stored)


def test_deletion_is_detected(storage):
    stored = storage.write("c/x.ckpt", b"payload")
    storage.delete(stored)
    with pytest.raises(CheckpointMissingError, match="missing") as error:
        storage.read(stored)
    assert stored.path in str(error.value)
    assert isinstance(error.value, CheckpointUnavailableError)
    storage.delete(stored)  # idempotent


def test_storage_pickles(storage):
    stored = storage.write("p.ckpt", b"abc")
    clone = pickle.loads(pickle.dumps(storage))
    assert clone.read(stored) == b"abc"  # memory:// works here: same process


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", "a/", "a\\b", ".."])
def test_bad_keys_rejected(tmp_path, key):
    with pytest.raises(ValueError, match="key must be"):
        CheckpointStorage(str(tmp_path)).write(key, b"x")


def test_bad_filesystem_rejected():
    with pytest.raises(TypeError, match="storage_filesystem"):
        CheckpointStorage("/tmp/x", storage_filesystem="s3")


def test_local_path_layout(tmp_path):
    storage = CheckpointStorage(f"file://{tmp_path}/exp/")
    stored = storage.write("checkpoints/a.ckpt", b"abc")
    assert stored.path == f"{tmp_path}/exp/checkpoints/a.ckpt"
    assert (tmp_path / "exp" / "checkpoints" / "a.ckpt").read_bytes() == b"abc"
    assert os.listdir(tmp_path / "exp" / "checkpoints") == ["a.ckpt"]


def test_pack_store_unpack(tmp_path):
    source = tmp_path / "ckpt"
    source.mkdir()
    _make_tree(source)
    storage = CheckpointStorage(str(tmp_path / "exp"))
    stored = storage.write("checkpoints/tree.tar", pack_directory(str(source)))
    unpack_directory(storage.read(stored), str(tmp_path / "restored"))
    assert _snapshot(tmp_path / "restored") == _snapshot(source)


# ---------------------------------------------------------------- cache


def test_evictions_by_density():
    cache = CheckpointCache(budget_bytes=250)
    cache.add("dense", 100, recompute_seconds=100.0, expected_reuse=2)  # 2.0 s/B
    cache.add("medium", 100, recompute_seconds=50.0, expected_reuse=1)  # 0.5
    cache.add("sparse", 100, recompute_seconds=10.0, expected_reuse=1)  # 0.1
    assert cache.resident_bytes == 300
    assert cache.over_budget() == 50
    assert cache.evictions() == ["sparse"]
    cache.budget_bytes = 50
    assert cache.evictions() == ["sparse", "medium", "dense"]
    with pytest.raises(ValueError, match="budget_bytes"):
        cache.budget_bytes = -1
    assert CheckpointCache(50).evictions() == []


def test_evictions_stop_when_within_budget():
    cache = CheckpointCache(budget_bytes=100)
    for index, density in enumerate([3, 1, 2]):
        cache.add(index, 100, recompute_seconds=density * 100.0, expected_reuse=1)
    assert cache.evictions() == [1, 2]


def test_within_budget_gives_nothing():
    cache = CheckpointCache(budget_bytes=1000)
    cache.add("a", 500, 1.0, 1)
    cache.add("b", 500, 1.0, 0)
    assert cache.over_budget() == 0
    assert cache.evictions() == []


def test_pinned_never_evicted():
    cache = CheckpointCache(budget_bytes=0)
    cache.add("pinned", 100, 0.0, 0, pinned=True)
    cache.add("free", 100, 1000.0, 10)
    assert cache.evictions() == ["free"]
    cache.mark_evicted("free")
    assert cache.evictions() == []
    assert cache.over_budget() == 100
    with pytest.raises(ValueError, match="pinned"):
        cache.mark_evicted("pinned")
    cache.update("pinned", pinned=False)
    assert cache.evictions() == ["pinned"]


def test_zero_reuse_goes_first():
    cache = CheckpointCache(budget_bytes=100)
    cache.add("unused", 100, recompute_seconds=1e6, expected_reuse=0)  # density 0, huge recompute
    cache.add("free_to_recompute", 100, recompute_seconds=0.0, expected_reuse=5)  # density 0 too
    cache.add("used", 100, recompute_seconds=1.0, expected_reuse=1)
    assert cache.evictions() == ["unused", "free_to_recompute"]


def test_update_changes_order():
    cache = CheckpointCache(budget_bytes=100)
    cache.add("a", 100, 10.0, 1)
    cache.add("b", 100, 20.0, 1)
    assert cache.evictions() == ["a"]
    cache.update("a", expected_reuse=3)
    assert cache.evictions() == ["b"]
    cache.update("b", recompute_seconds=1000.0)
    assert cache.evictions() == ["a"]


def test_ties_broken_by_least_recent_use():
    cache = CheckpointCache(budget_bytes=100)
    cache.add("a", 100, 1.0, 1)
    cache.add("b", 100, 1.0, 1)
    assert cache.evictions() == ["a"]
    cache.touch("a")
    assert cache.evictions() == ["b"]


def test_evict_and_reload_accounting():
    cache = CheckpointCache(budget_bytes=100)
    cache.add("a", 80, 1.0, 1)
    cache.add("b", 80, 2.0, 1)
    assert len(cache) == 2 and "a" in cache and "zz" not in cache
    assert sorted(cache) == ["a", "b"]
    (victim,) = cache.evictions()
    cache.mark_evicted(victim)
    cache.mark_evicted(victim)  # idempotent
    assert victim == "a" and cache.resident_bytes == 80 and not cache.is_resident("a")
    assert "a" in cache and len(cache) == 2
    assert cache.evictions() == []
    cache.mark_resident("a")
    assert cache.resident_bytes == 160 and cache.is_resident("a")
    assert cache.evictions() == ["a"]  # density decides, not recency
    cache.remove("b")
    assert cache.resident_bytes == 80 and "b" not in cache
    cache.mark_evicted("a")
    cache.remove("a")
    assert cache.resident_bytes == 0 and len(cache) == 0


def test_zero_size_entries_are_not_evicted():
    cache = CheckpointCache(budget_bytes=0)
    cache.add("empty", 0, 0.0, 0)
    cache.add("big", 10, 5.0, 1)
    assert cache.evictions() == ["big"]


def test_validation_messages():
    for bad in (-1, 1.5, "10", True, None):
        with pytest.raises(ValueError, match="budget_bytes"):
            CheckpointCache(bad)
    cache = CheckpointCache(0)
    with pytest.raises(ValueError, match="size_bytes"):
        cache.add("a", -1, 1.0, 1)
    with pytest.raises(ValueError, match="size_bytes"):
        cache.add("a", 2.5, 1.0, 1)
    with pytest.raises(ValueError, match="recompute_seconds"):
        cache.add("a", 1, -1.0, 1)
    with pytest.raises(ValueError, match="recompute_seconds"):
        cache.add("a", 1, float("nan"), 1)
    with pytest.raises(ValueError, match="expected_reuse"):
        cache.add("a", 1, 1.0, -2)
    cache.add("a", 1, 1.0, 1)
    with pytest.raises(ValueError, match="already in the cache"):
        cache.add("a", 1, 1.0, 1)
    with pytest.raises(ValueError, match="expected_reuse"):
        cache.update("a", expected_reuse=float("inf"))
    with pytest.raises(KeyError, match="not in the cache"):
        cache.update("missing", pinned=True)
    with pytest.raises(KeyError, match="not in the cache"):
        cache.remove("missing")
    with pytest.raises(KeyError, match="not in the cache"):
        cache.touch("missing")


_entries = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=1000),  # size
        st.floats(min_value=0, max_value=1e4),  # recompute seconds
        st.floats(min_value=0, max_value=20),  # expected reuse
        st.booleans(),  # pinned
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(entries=_entries, budget=st.integers(min_value=0, max_value=5000), evicted=st.sets(st.integers(0, 29)))
def test_evictions_restore_budget(entries, budget, evicted):
    cache = CheckpointCache(budget)
    for index, (size, recompute, reuse, pinned) in enumerate(entries):
        cache.add(index, size, recompute, reuse, pinned=pinned)
        if index in evicted and not pinned:
            cache.mark_evicted(index)
    keys = cache.evictions()
    assert len(keys) == len(set(keys))
    densities = []
    for key in keys:
        size, recompute, reuse, pinned = entries[key]
        assert not pinned and cache.is_resident(key)
        densities.append((reuse > 0, recompute * reuse / size))
        cache.mark_evicted(key)
    assert densities == sorted(densities), "lowest benefit density first, unused first"
    remaining_unpinned = [
        key for key in cache if cache.is_resident(key) and not cache.is_pinned(key) and entries[key][0] > 0
    ]
    assert cache.resident_bytes <= budget or not remaining_unpinned
    # Minimal: without the last chosen key the budget would not be met.
    if keys:
        assert cache.resident_bytes + entries[keys[-1]][0] > budget
    assert cache.resident_bytes == sum(entries[key][0] for key in cache if cache.is_resident(key))


@pytest.mark.parametrize("scheme", ["local", "memory"])
def test_remove_folders_keeps_the_named_ones_and_other_entries(tmp_path, scheme):
    root = str(tmp_path) if scheme == "local" else f"memory://remove-{uuid.uuid4().hex}"
    storage = CheckpointStorage(root)
    for name in ("checkpoint_000000", "checkpoint_000001", "checkpoint_000002", "other"):
        storage.write(f"trial/{name}/data", b"x")
    storage.write("trial/checkpoint_file", b"a file, not a folder")
    removed = storage.remove_folders("trial", "checkpoint_", keep=["checkpoint_000001"])
    assert sorted(removed) == ["checkpoint_000000", "checkpoint_000002"]
    listing = storage.filesystem.ls(storage.path("trial"), detail=False)
    left = sorted(posixpath.basename(entry.rstrip("/")) for entry in listing)
    assert left == ["checkpoint_000001", "checkpoint_file", "other"]
    assert storage.remove_folders("no_such_trial", "checkpoint_", keep=[]) == []
