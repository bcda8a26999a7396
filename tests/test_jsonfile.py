"""Result files of JSON, plain or gzipped (common.jsonfile): what is written is read back, either way."""

import gzip
import json

import pytest

from common.jsonfile import read_json, write_json


@pytest.mark.parametrize("name", ["rows.json", "rows.json.gz"])
def test_what_is_written_is_read_back(tmp_path, name) -> None:
    data = {"env": {"gpu": "none"}, "rows": [{"matrix": "a", "ratio": 1.25}, {"matrix": "b", "ratio": None}]}
    path = tmp_path / name
    write_json(path, data)
    assert read_json(path) == data
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")  # gzip's magic bytes exactly where the name says
    if name.endswith(".gz"):
        assert json.loads(gzip.decompress(raw)) == data


def test_the_same_data_gives_the_same_gzipped_bytes(tmp_path) -> None:
    """No timestamp or file name in the gzip header: a result written again does not change in git."""
    write_json(tmp_path / "a.json.gz", {"x": 1})
    write_json(tmp_path / "b.json.gz", {"x": 1})
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()


def test_a_corrupt_gzip_file_raises(tmp_path) -> None:
    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises((OSError, EOFError)):
        read_json(path)
