"""Paths from listings stay in their room: the exact limits of a relative path, each reason named, and
files created and read below a root without following a link (cluster/paths.py)."""

from __future__ import annotations

import os
import stat

import pytest

from redline.cluster.paths import (
    MAX_DEPTH,
    MAX_RELATIVE_CHARS,
    MAX_SEGMENT_BYTES,
    NotFound,
    NotRegular,
    create_below,
    read_local_below,
    relative_parts,
)
from redline.errors import RedlineError


def refusal(rel: str) -> str:
    with pytest.raises(RedlineError) as err:
        relative_parts(rel, "the key")
    return str(err.value)


def test_relative_paths_are_accepted_up_to_each_limit():
    assert relative_parts("a/b.txt", "k") == ["a", "b.txt"]
    assert relative_parts("a..b/.hidden/c.", "k") == ["a..b", ".hidden", "c."]  # dots inside names are names
    longest = "/".join(["x" * 200] * 5) + "/" + "y" * (MAX_RELATIVE_CHARS - 5 * 201)
    assert len(longest) == MAX_RELATIVE_CHARS and len(relative_parts(longest, "k")) == 6
    deepest = "/".join(["d"] * MAX_DEPTH)
    assert len(relative_parts(deepest, "k")) == MAX_DEPTH
    assert relative_parts("é" * (MAX_SEGMENT_BYTES // 2) + "a", "k")  # exactly 255 bytes of UTF-8


@pytest.mark.parametrize("rel, why", [
    ("", "it is empty"),
    ("x" * (MAX_RELATIVE_CHARS + 1), f"it is longer than {MAX_RELATIVE_CHARS} characters"),
    ("a\\b", "it holds a backslash or a control character"),
    ("a\x1fb", "it holds a backslash or a control character"),
    ("a\x7fb", "it holds a backslash or a control character"),
    ("/etc/passwd", "it starts with '/'"),
    ("a//b", "it has an empty, '.' or '..' segment"),
    ("a/./b", "it has an empty, '.' or '..' segment"),
    ("a/b/", "it has an empty, '.' or '..' segment"),
    ("../x", "it has an empty, '.' or '..' segment"),
    ("/".join(["d"] * (MAX_DEPTH + 1)), f"it is more than {MAX_DEPTH} folders deep"),
    ("é" * (MAX_SEGMENT_BYTES // 2 + 1), f"a segment is longer than {MAX_SEGMENT_BYTES} bytes"),
])
def test_each_refusal_names_its_reason_and_the_path(rel, why):
    message = refusal(rel)
    assert message.startswith(f"refusing the key: {why} (")
    assert message.endswith(" would not stay inside its directory)")
    if len(rel) <= 120:
        assert repr(rel) in message


def test_a_long_refused_path_is_shown_cut_to_120_characters():
    rel = "../" + "x" * 200
    message = refusal(rel)
    assert repr(rel[:117] + "...") in message and rel not in message
    assert repr("../" + "x" * 117) in refusal("../" + "x" * 117)  # 120 characters: shown whole
    assert repr("../" + "x" * 114 + "...") in refusal("../" + "x" * 118)  # 121: cut


def test_files_are_created_below_the_root_with_private_modes(tmp_path):
    with create_below(tmp_path, ["a", "b", "c.txt"], "the key") as f:
        f.write(b"data")
    assert (tmp_path / "a" / "b" / "c.txt").read_bytes() == b"data"
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b" / "c.txt").st_mode) == 0o600
    with create_below(tmp_path, ["a", "d.txt"], "the key") as f:  # an existing folder is reused
        f.write(b"more")
    assert (tmp_path / "a" / "d.txt").read_bytes() == b"more"


def test_creating_refuses_links_repeats_and_file_folder_clashes(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(RedlineError, match="refusing the key: link is both a file and a folder in the listing, or a link"):
        with create_below(root, ["link", "x.txt"], "the key"):
            pass
    (root / "file-link").symlink_to(outside / "target.txt")
    with pytest.raises(RedlineError, match="given twice"):  # O_EXCL: a planted link is never written through
        with create_below(root, ["file-link"], "the key"):
            pass
    assert not (outside / "target.txt").exists() and list(outside.iterdir()) == []
    with create_below(root, ["once.txt"], "the key"):
        pass
    with pytest.raises(RedlineError, match="refusing the key: its path is given twice in the listing"):
        with create_below(root, ["once.txt"], "the key"):
            pass
    with pytest.raises(RedlineError, match="refusing the key: once.txt is both a file and a folder"):
        with create_below(root, ["once.txt", "inner.txt"], "the key"):
            pass


def test_reading_below_a_root(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rows.txt").write_bytes(b"12345")
    assert read_local_below(tmp_path, ["run", "rows.txt"]) == b"12345"
    assert read_local_below(tmp_path, ["run", "rows.txt"], max_bytes=5) == b"12345"  # exactly the limit
    with pytest.raises(RedlineError, match=r"rows.txt is 5 bytes, over the limit of 4$"):
        read_local_below(tmp_path, ["run", "rows.txt"], max_bytes=4)
    with pytest.raises(NotFound, match=f"^file not found: {tmp_path}/run/none.txt$"):
        read_local_below(tmp_path, ["run", "none.txt"])
    with pytest.raises(NotRegular, match=f"^{tmp_path}/run is not a regular file$"):
        read_local_below(tmp_path, ["run"])
    (tmp_path / "secret.txt").write_text("secret")
    (tmp_path / "run" / "link.txt").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "hop").symlink_to(tmp_path / "run")
    for parts in (["run", "link.txt"], ["hop", "rows.txt"], ["run", "rows.txt", "deeper"]):
        with pytest.raises(NotRegular, match="is not a regular file below .* \\(a symbolic link or not a folder\\)"):
            read_local_below(tmp_path, parts)


def test_other_read_failures_are_one_line_errors(tmp_path):
    with pytest.raises(RedlineError, match=r"^cannot read .*: \[Errno 36\] File name too long"):
        read_local_below(tmp_path, ["x" * 300])
