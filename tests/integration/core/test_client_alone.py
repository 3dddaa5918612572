"""A program with the client package and msgpack, and nothing else of polymq's dependencies,
talks to a real core: what a user who installs only ``libs/polymq`` (``polymq-client``) has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ...procs import PolymqProcess

CLIENT = Path(__file__).resolve().parents[3] / "libs" / "polymq"

# Run isolated (-I: no PYTHONPATH, no script directory), with the client package first on the
# path and every import of a top-level module that is neither the standard library, the
# client nor msgpack refused: as if aiohttp, prometheus-client, fastavro and polymq_server
# were not installed.
PROGRAM = """
import importlib.abc, json, sys
sys.path.insert(0, sys.argv[1])
ALLOWED = set(sys.stdlib_module_names) | {"polymq", "msgpack"}
refused = []

class OnlyTheClient(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in ALLOWED:
            refused.append(top)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, OnlyTheClient())
before = {m.partition(".")[0] for m in sys.modules}

import asyncio
import polymq
from polymq import Client, Message

async def main(port):
    async with await Client.connect("127.0.0.1", port) as client:
        sub = await client.subscribe("queue/alone", ack_mode="client")
        receipt = await client.publish("queue/alone", Message(b"hello", content_type="text/plain"))
        delivery = await asyncio.wait_for(sub.get(10), 10)
        delivery.ack()
        return {"published": receipt.count, "body": delivery.message.body.decode(),
                "content_type": delivery.message.content_type}

out = asyncio.run(main(int(sys.argv[2])))
imported = {m.partition(".")[0] for m in sys.modules} - before - set(sys.stdlib_module_names)
imported = sorted(m for m in imported if "cython" not in m)  # (msgpack's C part)
out.update(file=polymq.__file__, imported=imported, refused=sorted(set(refused)))
print(json.dumps(out))
"""


def test_the_client_needs_only_msgpack(core: PolymqProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", PROGRAM, str(CLIENT), str(core.ports["core"])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["file"] == str(CLIENT / "polymq" / "__init__.py")
    assert out["published"] == 1
    assert out["body"] == "hello" and out["content_type"] == "text/plain"
    assert out["imported"] == ["msgpack", "polymq"]
    # nothing else was even tried (but for the standard library's look for Jython's ``org``)
    assert set(out["refused"]) <= {"org"}
