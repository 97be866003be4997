"""A directory named like a data file (a partitioned parquet data set) is said to be a directory, at
load and where the rows are read, with the files to list instead."""

from __future__ import annotations

import pytest

from megarl.config import ConfigError, load_config
from megarl.data.files import DataError, read_rows

pytestmark = pytest.mark.unit


def test_a_directory_named_like_a_parquet_file_is_not_reported_missing(tmp_path):
    empty, parts = tmp_path / "x.parquet", tmp_path / "parts.parquet"
    empty.mkdir()
    parts.mkdir()
    for i in range(4):
        (parts / f"part-{i}.parquet").touch()
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"data.train_files=[{empty}]", f"data.val_files=[{parts}]"], check_paths=True)
    assert (
        f"data.train_files[0]={empty} is a directory, not a data file, and holds no .parquet, .jsonl or .json file; name a data file"
        in info.value.problems
    )
    assert (
        f"data.val_files[0]={parts} is a directory, not a data file; list the data files in it instead: "
        f"[{parts}/part-0.parquet, {parts}/part-1.parquet, {parts}/part-2.parquet, ... (1 more)]"
    ) in info.value.problems
    with pytest.raises(DataError) as read:
        read_rows(str(parts), "data.val_files")
    assert str(read.value) == (
        f"data.val_files: {parts} is a directory, not a data file; list the data files in it instead: "
        f"[{parts}/part-0.parquet, {parts}/part-1.parquet, {parts}/part-2.parquet, ... (1 more)]"
    )
