"""The STOMP codec compiled with mypyc, used only where it was built from the sources beside it.

``make compiled`` (which ``make run`` and ``make test`` call) runs ``python -m
polymq_stomp.compiled``: it copies :mod:`polymq_stomp.codec` (up to its ``TWIN_CUT`` line) to
``_codec_compiled.py`` with the SHA-256 of ``codec.py`` and ``frames.py`` appended, compiles
that copy with mypyc into ``_codec_compiled*.so`` in this folder, and deletes the copy (the
extension modules stay; git ignores them). Without mypyc or a C compiler it says so and builds
nothing: polymq then runs the pure-Python codec, which is the one the source is.

At its end :mod:`polymq_stomp.codec` asks :func:`load_twin` for the compiled module and, given
one, takes its public names (``__all__``) in place of its own, so every importer gets the
compiled classes. :func:`load_twin` gives None (the pure codec) when the compiled module is not
there, was built for another Python (the import fails), was compiled from other sources than
``codec.py`` and ``frames.py`` are now (an edit after the build: a warning names the fix), or
``POLYMQ_PURE_PYTHON`` is set (to compare the two, or to rule the compiled one out).

Why a twin of another name rather than mypyc's own ``codec*.so`` beside ``codec.py``: that
one is imported instead of the source, so in an editable checkout an edit of ``codec.py``
would silently not run. The twin is checked against the sources at every start (a hash of
two small files).

What it gains (``python -m tests.unit.stomp.bench_codec``, and the README's Performance):
the parse of a SEND frame about a third, the encode of a MESSAGE about two fifths.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

__all__ = ["PURE_ENV", "TWIN", "TWIN_CUT", "build", "load_twin", "source_digest"]

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
PACKAGE = __package__ or "polymq_stomp"
TWIN = "_codec_compiled"  # the compiled module's name in this package
SOURCES = ("codec.py", "frames.py")  # what it is compiled from (codec.py imports frames.py)
TWIN_CUT = "# ---- the compiled twin"  # codec.py's line from which the copy leaves out
PURE_ENV = "POLYMQ_PURE_PYTHON"  # set (non-empty): always the pure-Python codec
_SAYS = f"{PACKAGE}.compiled:"  # what the build's messages begin with


def source_digest(folder: Path = HERE) -> str:
    """The SHA-256 (hex) of the sources the twin is compiled from, as they are in ``folder``."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()


def load_twin(folder: Path = HERE, package: str = PACKAGE) -> ModuleType | None:
    """The compiled codec if it is there and was compiled from the sources in ``folder`` as
    they are now; None otherwise (the caller keeps the pure-Python codec)."""
    if os.environ.get(PURE_ENV):
        return None
    try:
        twin = importlib.import_module(f"{package}.{TWIN}")
    except ImportError:
        return None  # not built, or built for another Python
    try:
        current = source_digest(folder)
    except OSError:
        return None
    if getattr(twin, "SOURCE_SHA256", None) != current:
        log.warning(
            "the compiled STOMP codec (%s) was built from another codec.py or frames.py than "
            "these: running the pure-Python codec ('make compiled' builds it again)",
            twin.__file__,
        )
        return None
    return twin


def _twin_source(folder: Path) -> str:
    """codec.py up to its ``TWIN_CUT`` line, and the digest of what it was made from."""
    text = (folder / "codec.py").read_text()
    cut = text.find(TWIN_CUT)
    if cut < 0:
        raise SystemExit(f"{folder / 'codec.py'} has no {TWIN_CUT!r} line")
    head = text[:cut].rstrip()
    return f"{head}\n\n\nSOURCE_SHA256: Final = {source_digest(folder)!r}\n"


def _remove(folder: Path) -> None:
    """The compiled twin's files in ``folder`` (extension modules and a stale copy)."""
    for path in folder.glob(f"{TWIN}*"):
        path.unlink()


def build(folder: Path = HERE) -> int:
    """Compile the twin into ``folder`` with mypyc; 0 when built, 1 when it could not be
    (what is missing said on stderr; an earlier build is removed either way)."""
    _remove(folder)
    mypyc = shutil.which("mypyc", path=str(Path(sys.executable).parent)) or shutil.which("mypyc")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if mypyc is None or compiler is None:
        missing = "mypyc (pip install mypy)" if mypyc is None else "a C compiler"
        print(f"{_SAYS} no {missing}: the pure-Python codec runs", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="polymq-mypyc-") as tmp:
        work = Path(tmp)
        package = work / PACKAGE  # (the name load_twin imports it under)
        package.mkdir()
        (package / "__init__.py").write_text("")
        shutil.copy(folder / "frames.py", package / "frames.py")
        (package / f"{TWIN}.py").write_text(_twin_source(folder))
        done = subprocess.run(
            [mypyc, f"{PACKAGE}/{TWIN}.py"],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print(done.stdout[-4000:], file=sys.stderr)
            print(f"{_SAYS} mypyc failed: the pure-Python codec runs", file=sys.stderr)
            return 1
        built = sorted(package.glob(f"{TWIN}*.so"))
        if not built:
            print(f"{_SAYS} mypyc built nothing", file=sys.stderr)
            return 1
        for path in built:
            shutil.copy(path, folder / path.name)
    print(f"{_SAYS} built {', '.join(p.name for p in built)} in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(build())
