"""``polymq spark-push`` argument and option errors: found before Spark starts (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from polymq_spark.cli import main


def test_a_bad_destination_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "x.parquet"
    f.write_bytes(b"")
    assert main(["--input", str(f), "--destination", "table/x", "--url", "http://127.0.0.1:1"]) == 2
    assert "'destination'" in capsys.readouterr().err


def test_a_missing_input_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--input", str(tmp_path / "none.csv"), "--destination", "stream/x", "--url", "http://h"]
    assert main(argv) == 2
    assert "no such file" in capsys.readouterr().err


def test_an_unknown_suffix_needs_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "data.bin"
    f.write_bytes(b"")
    assert main(["--input", str(f), "--destination", "stream/x", "--url", "http://h"]) == 2
    assert "--format" in capsys.readouterr().err


def test_a_malformed_extra_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "d.json"
    f.write_text("{}\n")
    argv = [
        "--input",
        str(f),
        "--destination",
        "stream/x",
        "--url",
        "http://h",
        "--option",
        "codec=lz4",
    ]
    assert main(argv) == 2
    assert "'codec'" in capsys.readouterr().err


def test_missing_required_arguments_exit_2() -> None:
    with pytest.raises(SystemExit) as err:
        main(["--input", "x"])
    assert err.value.code == 2
