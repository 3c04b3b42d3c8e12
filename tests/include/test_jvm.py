"""The local file system Spark uses here: same answers as Hadoop's, without forking processes."""

from __future__ import annotations

import os

import pytest

from include.jvm import ABSTRACT_FILE_SYSTEM_CLASS, FILE_SYSTEM_CLASS


def _status(status) -> tuple:  # noqa: ANN001 - a py4j FileStatus
    return (
        status.getLen(), status.isDirectory(), status.isSymlink(), status.getModificationTime(),
        status.getPermission().toString(), status.getOwner(), status.getGroup(), status.getPath().toString(),
    )


def test_spark_uses_the_fast_local_file_system(spark) -> None:  # noqa: ANN001
    jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
    file_system = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert file_system.getClass().getName() == FILE_SYSTEM_CLASS
    file_context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(conf)
    assert file_context.getDefaultFileSystem().getClass().getName() == ABSTRACT_FILE_SYSTEM_CLASS


def test_statuses_and_permissions_match_hadoops_own(spark, tmp_path) -> None:  # noqa: ANN001
    jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
    fast = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)  # Spark's RocksDB state store casts it to LocalFileSystem
    hadoop = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    hadoop.initialize(jvm.java.net.URI("file:///"), conf)
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("twelve bytes")
    os.chmod(tmp_path / "file.txt", 0o640)
    os.symlink(tmp_path / "file.txt", tmp_path / "link")
    path = lambda name: jvm.org.apache.hadoop.fs.Path(str(tmp_path / name))  # noqa: E731

    for name in ("folder", "file.txt", "link"):
        assert _status(fast.getFileStatus(path(name))) == _status(hadoop.getFileStatus(path(name)))
    assert fast.getFileLinkStatus(path("link")).isSymlink()
    assert fast.getFileLinkStatus(path("link")).getSymlink().toString() == str(tmp_path / "file.txt")
    listed = sorted(_status(s) for s in fast.listStatus(path(".")))
    assert listed == sorted(_status(s) for s in hadoop.listStatus(path(".")))

    # Files and folders it creates get the permissions Hadoop would give them (umask applied).
    fast.mkdirs(path("made/deeper"))
    stream = fast.create(path("made/new.bin"))
    stream.write(bytearray(b"x"))
    stream.close()
    assert not (tmp_path / "made" / ".new.bin.crc").exists()  # no checksum files
    for name in ("made/deeper", "made/new.bin"):
        assert _status(fast.getFileStatus(path(name))) == _status(hadoop.getFileStatus(path(name)))
    fast.setPermission(path("made/new.bin"), jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o600))
    assert oct(os.stat(tmp_path / "made/new.bin").st_mode & 0o777) == oct(0o600)
    with pytest.raises(Exception, match="FileNotFoundException"):
        fast.getFileStatus(path("missing"))
