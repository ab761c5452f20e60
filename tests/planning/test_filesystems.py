"""The one storage backend resolver: every writer gets an fsspec filesystem,
and readers that take only pyarrow get back what the user gave."""

import fsspec
import pyarrow.fs as pafs
import pytest

from ray_stagetree.planning.filesystems import arrow_filesystem, resolve


def test_a_url_resolves_to_its_fsspec_filesystem_and_path():
    filesystem, path = resolve("memory://studies/a")
    assert isinstance(filesystem, fsspec.AbstractFileSystem) and path == "/studies/a"


def test_a_pyarrow_filesystem_is_wrapped_for_writers_and_comes_back_as_itself():
    given = pafs.SubTreeFileSystem("/tmp", pafs.LocalFileSystem())
    filesystem, path = resolve("exp/plan", given)
    assert isinstance(filesystem, fsspec.AbstractFileSystem) and path == "exp/plan"
    assert arrow_filesystem(filesystem) is given


def test_an_fsspec_filesystem_is_used_as_it_is():
    given = fsspec.filesystem("memory")
    filesystem, path = resolve("/exp", given)
    assert filesystem is given and path == "/exp"
    assert isinstance(arrow_filesystem(filesystem), pafs.PyFileSystem)


def test_anything_else_is_refused_by_name():
    with pytest.raises(
        TypeError,
        match="storage_filesystem must be a pyarrow.fs.FileSystem, an fsspec.AbstractFileSystem or None, got str",
    ):
        resolve("/exp", "s3")


def test_a_url_without_its_fsspec_driver_opens_with_pyarrows_filesystem_as_tune_does(monkeypatch):
    def no_driver(url, **options):
        raise ImportError("Install s3fs to access S3")

    monkeypatch.setattr(fsspec.core, "url_to_fs", no_driver)
    filesystem, path = resolve("s3://bucket/studies/a?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1")
    assert isinstance(arrow_filesystem(filesystem), pafs.S3FileSystem) and path == "bucket/studies/a"
    with pytest.raises(ImportError, match="Install s3fs"):
        resolve("nosuchscheme://bucket/a")
