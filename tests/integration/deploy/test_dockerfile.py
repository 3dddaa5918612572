"""The Dockerfile and .dockerignore, read (no Docker engine runs here, so the image itself is
never built by the tests): multi-stage, a slim Python base, a non-root user, no compiler or
npm in the final stage, no HEALTHCHECK, `polymq` as the entry point (a console script of the
project), no secrets in the build context, and everything the services read at run time in
the image (the STOMP page's stompjs bundle, the package data)."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

from polymq_amqp.config import AmqpSettings
from polymq_avro.config import AvroSettings
from polymq_core.admin.console import CHART_FILES
from polymq_core.config import CoreSettings
from polymq_http.config import HttpSettings
from polymq_longpoll.config import LongpollSettings
from polymq_stomp.config import StompSettings

from .chart import ROOT

DOCKERFILE = ROOT / "Dockerfile"


@dataclasses.dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]]  # (INSTRUCTION, rest of the line)

    def all(self, instruction: str) -> list[str]:
        return [rest for ins, rest in self.instructions if ins == instruction]


def parse() -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages of the Dockerfile (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name, []))
        elif not stages and instruction == "ARG":
            key, _, value = rest.partition("=")
            args[key.strip()] = value.strip()
        else:
            stages[-1].instructions.append((instruction, rest.strip()))
    return args, stages


def final() -> Stage:
    return parse()[1][-1]


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in stage.all("ENV"):
        for word in shlex.split(rest):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def test_multi_stage_on_a_slim_python() -> None:
    _, stages = parse()
    assert len(stages) >= 2
    assert final().base == "python:3.11-slim"
    assert final().name is None
    builders = {s.name for s in stages[:-1]}
    copies_from = {m for c in final().all("COPY") for m in re.findall(r"--from=(\S+)", c)}
    assert copies_from and copies_from <= builders  # only built results reach the image


def test_the_final_stage_runs_as_a_non_root_user_without_build_tools() -> None:
    stage = final()
    users = stage.all("USER")
    assert users, "no USER: the container would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0") and (not user.isdigit() or int(user) > 0)
    # the chart's securityContext runs as this uid (runAsNonRoot needs a numeric USER)
    assert user.isdigit() and int(user) == 10001
    runs = " ".join(stage.all("RUN"))
    for tool in ("build-essential", "gcc", "npm", "pip install", "apt-get install"):
        assert tool not in runs, tool
    # Kubernetes probes /healthz and /readyz; a HEALTHCHECK would only run under Docker
    assert not any(s.all("HEALTHCHECK") for s in parse()[1])


def test_the_entry_point_is_the_polymq_console_script() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["polymq"] == "polymq_cli.main:main"
    [entrypoint] = final().all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["polymq"]
    [cmd] = final().all("CMD")
    assert json.loads(cmd)[0] in {"run", "core", "http", "stomp", "longpoll", "avro", "amqp"}
    # the builder installs the project (with uvloop, which the CLI uses when present, and
    # nats-py and nats-server for the replicated core)
    runs = " ".join(r for s in parse()[1][:-1] for r in s.all("RUN"))
    assert 'pip wheel --wheel-dir /wheels ".[fast,cluster]"' in runs
    assert {"fast", "cluster"} <= set(project["optional-dependencies"])


def test_the_image_environment_names_real_settings() -> None:
    env = env_of(final())
    fields = set()
    for settings in (
        CoreSettings,
        HttpSettings,
        LongpollSettings,
        StompSettings,
        AvroSettings,
        AmqpSettings,
    ):
        fields |= {f.name for f in dataclasses.fields(settings)}
    for name in env:
        if name.startswith("POLYMQ_"):
            assert name.removeprefix("POLYMQ_").lower() in fields, name
    assert env["POLYMQ_HOST"] == "0.0.0.0"
    assert env["PATH"].startswith("/opt/polymq/bin:")


def test_the_stomp_page_library_is_in_the_image() -> None:
    """The STOMP frontend serves @stomp/stompjs from POLYMQ_STOMP_STOMPJS (page.py): the
    bundle npm installs from the lock file is copied to exactly that path."""
    stage = final()
    bundle = env_of(stage)["POLYMQ_STOMP_STOMPJS"]
    copies = [c.split() for c in stage.all("COPY")]
    [copy] = [c for c in copies if c[-1] == bundle]
    assert copy[1].endswith("node_modules/@stomp/stompjs/bundles/stomp.umd.min.js")
    [web] = [s for s in parse()[1] if s.name == copy[0].removeprefix("--from=")]
    assert any("package-lock.json" in c for c in web.all("COPY"))
    assert any("npm ci" in r for r in web.all("RUN"))  # the locked version, not the newest


def test_the_console_chart_library_is_in_the_image() -> None:
    """The core's console serves uPlot's files from POLYMQ_CONSOLE_CHART (console.py): the
    files npm installs from the lock file are copied to exactly that directory."""
    stage = final()
    where = env_of(stage)["POLYMQ_CONSOLE_CHART"]
    copies = [c.split() for c in stage.all("COPY")]
    [copy] = [c for c in copies if c[-1].rstrip("/") == where]
    assert copy[-1].endswith("/")  # (several files into a directory)
    sources = copy[1:-1]
    assert all(s.startswith("/console/node_modules/uplot/dist/") for s in sources), sources
    assert sorted(Path(s).name for s in sources) == sorted(CHART_FILES)
    [web] = [s for s in parse()[1] if s.name == copy[0].removeprefix("--from=")]
    assert any("services/core/web/package-lock.json" in c for c in web.all("COPY"))
    assert any("npm ci" in r for r in web.all("RUN"))


def test_the_image_carries_the_compiled_stomp_codec() -> None:
    """The build stage compiles the STOMP codec (mypyc) in the source tree before it builds
    the wheels, which carry it as package data; a checkout's own build never enters the
    context (it was compiled for that machine's Python)."""
    build = next(s for s in parse()[1] if s.name == "build")
    runs = build.all("RUN")
    compiles = [i for i, r in enumerate(runs) if "polymq_stomp/compiled.py" in r]
    wheels = [i for i, r in enumerate(runs) if "pip wheel" in r]
    assert compiles and wheels and compiles[0] < wheels[0], runs
    assert "mypy" in runs[compiles[0]], runs[compiles[0]]
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    built = "_codec_compiled.cpython-311-x86_64-linux-gnu.so"
    assert any(fnmatch.fnmatch(built, g) for g in globs["package-data"]["polymq_stomp"])
    assert ignored(f"services/stomp/polymq_stomp/{built}")


def test_package_data_reaches_the_wheel() -> None:
    """Files the services read next to their modules are declared as package data, so the
    wheel the image installs carries them (the image has no source tree)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = [ROOT / w for w in tool["packages"]["find"]["where"]]
    globs = tool["package-data"]
    for root in roots:
        for package in (p for p in root.iterdir() if (p / "__init__.py").is_file()):
            for path in package.rglob("*"):
                if not path.is_file() or path.suffix in (".py", ".pyc", ".typed"):
                    continue
                relative = path.relative_to(package).as_posix()
                patterns = globs.get(package.name, [])
                assert any(fnmatch.fnmatch(relative, g) for g in patterns), (package.name, relative)


# ---- .dockerignore: Docker's rules (last match wins, `!` re-includes, a match on a directory
# excludes what is under it) --------------------------------------------------------------------
def _pattern(glob: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif glob.startswith("**", i):
            out += ".*"
            i += 2
        elif glob[i] == "*":
            out += "[^/]*"
            i += 1
        elif glob[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(glob[i])
            i += 1
    return re.compile(out + "$")


def ignored(path: str) -> bool:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            rules.append((negate, _pattern(line.lstrip("!").strip("/"))))
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for negate, pattern in rules:
        if any(pattern.match(p) for p in prefixes):
            result = not negate
    return result


def test_the_build_context_holds_the_sources_and_no_secrets() -> None:
    for path in (
        ".env",
        "services/.env.local",
        ".git/config",
        ".venv/bin/python",
        "services/stomp/web/node_modules/@stomp/stompjs/bundles/stomp.umd.min.js",
        "services/core/web/node_modules/uplot/dist/uPlot.iife.min.js",
        "libs/polymq/polymq/__pycache__/client.cpython-311.pyc",
        "tls.key",
        "services/stomp/cert.pem",
        "users.json",
        "polymq-data/shard-000.db",
        "tests/procs.py",
        "charts/polymq/values.yaml",
        "bench-results.json",
    ):
        assert ignored(path), path
    for path in (
        "pyproject.toml",
        "README.md",
        "libs/polymq/polymq/client.py",
        "services/stomp/web/package.json",
        "services/stomp/web/package-lock.json",
        "services/stomp/polymq_stomp/static/index.html",
        "services/core/web/package.json",
        "services/core/web/package-lock.json",
        "services/core/polymq_core/admin/static/console.js",
        "services/http/polymq_http/openapi.json",
    ):
        assert not ignored(path), path
    # everything the Dockerfile copies from the context is in it
    for stage in parse()[1]:
        for copy in stage.all("COPY"):
            words = copy.split()
            if any(w.startswith("--from=") for w in words):
                continue
            for source in words[:-1]:
                assert (ROOT / source).exists(), source
                assert not ignored(source.rstrip("/")), source
    # no secret or environment file is ever copied
    text = DOCKERFILE.read_text()
    assert not re.search(
        r"^\s*(COPY|ADD)\s.*(\.env|\.pem|\.key|secret|users\.json)", text, re.M | re.I
    )
    assert not re.search(r"^\s*ADD\s", text, re.M)  # COPY only: no remote URLs, no auto-extract


def test_dockerfile_paths_match_the_chart() -> None:
    """The chart mounts the store at /var/lib/polymq and runs as uid/gid 10001: the image
    makes that directory for that user, and its ports are the chart's defaults."""
    stage = final()
    runs = " ".join(stage.all("RUN"))
    assert "--uid 10001" in runs and "--gid 10001" in runs
    assert "/var/lib/polymq" in runs and env_of(stage)["POLYMQ_DATA_DIR"] == "/var/lib/polymq"
    [expose] = stage.all("EXPOSE")
    assert set(map(int, expose.split())) == {
        *(7400, 7401, 7480, 7490, 7470, 61613, 15674, 5672, 5671, 15692)
    }
    values = Path(ROOT / "charts" / "polymq" / "values.yaml").read_text()
    for port in expose.split():
        assert re.search(rf":\s*{port}\b", values), port
