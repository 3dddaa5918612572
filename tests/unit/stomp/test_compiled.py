"""The compiled STOMP codec (``polymq_stomp.compiled``): taken only where it was built from
the sources beside it, built by mypyc from a copy of the package, and the pure-Python codec
still passing the codec's tests.

The loader's choices are checked with a stand-in twin (a plain module that claims a digest),
the build and the switch end to end on a copy of the package in a temporary folder (mypyc
and a C compiler: ``make test`` installs both), so this checkout's own build is never
touched."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import polymq_stomp
from polymq_stomp import compiled

PACKAGE = Path(polymq_stomp.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[3]
CODEC_TESTS = [
    "tests/unit/stomp/test_codec.py",
    "tests/unit/stomp/test_codec_properties.py",
    "tests/unit/stomp/test_codec_stomppy.py",
    "tests/unit/stomp/test_codec_fuzz.py",
]


def copy_sources(folder: Path) -> Path:
    """codec.py and frames.py copied into ``folder``: the sources a twin is checked against."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in compiled.SOURCES:
        shutil.copy(PACKAGE / name, folder / name)
    return folder


def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digest: str) -> str:
    """A package holding a plain ``_codec_compiled`` module that says it was built from
    ``digest``, importable from ``tmp_path``; its name."""
    name = f"standin_{tmp_path.name.replace('-', '_')}"
    pkg = tmp_path / "path" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / f"{compiled.TWIN}.py").write_text(f"SOURCE_SHA256 = {digest!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "path"))
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    return name


def test_a_twin_built_from_these_sources_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = copy_sources(tmp_path / "src")
    name = stand_in(tmp_path, monkeypatch, compiled.source_digest(sources))
    twin = compiled.load_twin(sources, name)
    assert twin is not None and twin.__name__ == f"{name}.{compiled.TWIN}"


def test_a_twin_built_from_other_sources_is_refused_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sources = copy_sources(tmp_path / "src")
    name = stand_in(tmp_path, monkeypatch, compiled.source_digest(sources))
    with open(sources / "frames.py", "a") as f:  # an edit after the build, of either source
        f.write("# edited\n")
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        assert compiled.load_twin(sources, name) is None
    assert "make compiled" in caplog.text, caplog.text


def test_pure_python_when_asked_or_when_nothing_was_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = copy_sources(tmp_path / "src")
    name = stand_in(tmp_path, monkeypatch, compiled.source_digest(sources))
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    assert compiled.load_twin(sources, name) is None
    monkeypatch.delenv(compiled.PURE_ENV)
    assert compiled.load_twin(sources, "polymq_stomp_not_a_package") is None


def _codec_in(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Which codec ``import polymq_stomp.codec`` gives a new interpreter that finds the
    package in ``path`` first."""
    code = (
        "import polymq_stomp.codec as c, polymq_stomp.frames as f\n"
        "conn = c.StompConnection(c.Role.SERVER)\n"
        "conn.receive_data(b'CONNECT\\naccept-version:1.2\\nhost:/\\n\\n\\0')\n"
        "frame = conn.next_event()\n"
        "assert isinstance(frame, f.Frame) and frame.command is f.Command.CONNECT, frame\n"
        "print(c.COMPILED, c.StompConnection.__module__)\n"
    )
    run_env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    run_env.update(PYTHONPATH=str(path), **env)
    return subprocess.run(
        [sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=60
    )


def test_the_build_compiles_a_twin_that_is_used_until_a_source_changes(tmp_path: Path) -> None:
    """mypyc compiles a copy of the package's codec; a new interpreter that imports that copy
    gets the compiled classes, the pure ones once codec.py is edited (a warning says why),
    and the pure ones with POLYMQ_PURE_PYTHON set."""
    copy = tmp_path / "polymq_stomp"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "static"))
    assert compiled.build(copy) == 0, "mypyc or a C compiler missing: make test installs both"
    built = sorted(p.name for p in copy.glob(f"{compiled.TWIN}*.so"))
    assert len(built) == 2 and not list(copy.glob(f"{compiled.TWIN}*.py")), built

    used = _codec_in(tmp_path)
    assert used.returncode == 0, used.stderr
    assert used.stdout.split() == ["True", f"polymq_stomp.{compiled.TWIN}"], used.stdout

    pure = _codec_in(tmp_path, **{compiled.PURE_ENV: "1"})
    assert pure.returncode == 0, pure.stderr
    assert pure.stdout.split() == ["False", "polymq_stomp.codec"], pure.stdout

    with open(copy / "codec.py", "a") as f:
        f.write("# edited after the build\n")
    stale = _codec_in(tmp_path)
    assert stale.returncode == 0, stale.stderr
    assert stale.stdout.split() == ["False", "polymq_stomp.codec"], stale.stdout
    assert "make compiled" in stale.stderr, stale.stderr


def test_the_pure_codec_passes_the_codec_tests_too() -> None:
    """The codec's own tests run here with whichever codec this checkout loads (compiled,
    under make test); once more with the pure-Python one."""
    env = {**os.environ, compiled.PURE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *CODEC_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-500:]
