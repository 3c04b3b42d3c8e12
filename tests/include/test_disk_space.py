"""A full disk in each engine's words becomes one line naming the path; other errors stay theirs."""

from __future__ import annotations

import errno

from include.disk_space import NoSpaceLeftError, as_no_space_left, no_space_left

# As they reach Python: Hadoop's through Py4J, delta-rs' from Rust, Python's own.
SPARK = ("py4j.protocol.Py4JJavaError: An error occurred while calling o10340.parquet.\n"
         "Caused by: org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device\n")
DELTA_RS = "Generic LocalFileSystem error: Unable to copy data to file: No space left on device (os error 28)"


def test_a_full_disk_is_recognised_in_each_engines_words_and_through_causes():
    assert no_space_left(SPARK) and no_space_left(DELTA_RS)
    assert no_space_left(OSError(errno.ENOSPC, "No space left on device"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as cause:
            raise RuntimeError("writing the heartbeat failed") from cause
    except RuntimeError as wrapped:
        assert no_space_left(wrapped)
    assert not no_space_left(ValueError("space is left")) and not no_space_left(OSError(errno.EACCES, "denied"))


def test_the_line_names_the_most_precise_path_known():
    told = as_no_space_left(SPARK, "/lake/checkpoints/speed_ingest")
    assert str(told) == ("no space left on device writing /lake/checkpoints/speed_ingest: "
                         "free space and run the same command again")
    heartbeat = OSError(errno.ENOSPC, "No space left on device", "/lake/run/hb.tmp")
    assert as_no_space_left(heartbeat, "/lake").path == "/lake/run/hb.tmp"
    # A store's own line inside a query's traceback names the table: that path wins.
    inner = f"Traceback ...\ninclude.disk_space.NoSpaceLeftError: {NoSpaceLeftError('/lake/silver/clicks')}\n"
    assert as_no_space_left(inner, "/lake/checkpoints/speed_ingest").path == "/lake/silver/clicks"
    assert as_no_space_left(ValueError("bad"), "/lake") is None
