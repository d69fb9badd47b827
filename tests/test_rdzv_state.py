"""The rendezvous state is read as data (issue 20, item 1): deploy/host/torchrun.py, with torch's
own rendezvous code on a real TCPStore on loopback, a real torchrun, and a real agent.

torch's c10d rendezvous keeps its state pickled in the rendezvous host's store and unpickles it on
every poll; any member reaches the store. What a member plants here is what torch's c10d backend
stores (base64) of a pickle whose `__reduce__` would create a file. The cluster versions, with h3
as the member, are in tests/test_elastic.py and tests/test_check_network.py."""

from __future__ import annotations

import base64
import json
import pickle
import socket
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.api import RendezvousStateError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from meshrun import layout
from meshrun.deploy.host import torchrun as entry

TORCH_DISTRIBUTED = Path(dr.__file__).resolve().parents[2]


class Planted:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):  # unpickling it runs `open(path, "w")`
        return (open, (self.path, "w"))


def planted(path: Path) -> bytes:
    return base64.b64encode(pickle.dumps(Planted(path)))


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> TCPStore:
    """The rendezvous host's store; the rendezvous module as torch ships it (restored afterwards)."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as meshrun's elastic runs
    monkeypatch.setattr(dr, "pickle", pickle)
    return TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False,
                    timeout=timedelta(seconds=30))


def handler(store: TCPStore, run_id: str, addr: str) -> dr.DynamicRendezvousHandler:
    """A node of the rendezvous as torchrun makes it: its own client of the store, c10d backend."""
    client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=30))
    backend = C10dRendezvousBackend(client, run_id)
    return dr.DynamicRendezvousHandler.from_backend(run_id, client, backend, 2, 2, local_addr=addr,
                                                    timeout=dr.RendezvousTimeout(timedelta(seconds=30)))


def test_torchs_own_rendezvous_completes_with_its_state_as_json(store: TCPStore) -> None:
    entry.install(dr)
    nodes = [handler(store, "r1", f"10.0.0.{i}") for i in (1, 2)]
    infos: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: infos.__setitem__(i, nodes[i].next_rendezvous())) for i in (0, 1)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted((info.rank, info.world_size) for info in infos.values()) == [(0, 2), (1, 2)]
        held = json.loads(base64.b64decode(store.get("torch.rendezvous.r1")))
        assert sorted(held) == sorted(entry.FIELD_KINDS) and held["complete"] is True
        assert sorted((node[0], rank) for node, rank in held["participants"]) in ([("10.0.0.1", 0), ("10.0.0.2", 1)],
                                                                                [("10.0.0.1", 1), ("10.0.0.2", 0)])
        read = dr.pickle.loads(json.dumps(held).encode())
        assert vars(read) == vars(nodes[0]._state_holder.state)
    finally:
        for node in nodes:
            node.shutdown()  # closes the rendezvous: one more write and read through the codec


def test_a_planted_pickle_runs_under_torch_as_shipped_and_is_refused_through_the_codec(store: TCPStore,
                                                                                        tmp_path: Path) -> None:
    store.set("torch.rendezvous.r2", planted(tmp_path / "ran"))
    with pytest.raises(Exception):
        handler(store, "r2", "10.0.0.1").num_nodes_waiting()  # what the agent asks on every poll
    assert (tmp_path / "ran").exists()  # the hole, and proof that the payload is live
    (tmp_path / "ran").unlink()
    entry.install(dr)
    with pytest.raises(RendezvousStateError) as raised:
        handler(store, "r2", "10.0.0.2").num_nodes_waiting()
    assert str(entry.refusal(raised.value)) == "not JSON"
    assert not (tmp_path / "ran").exists()


def populated() -> dr._RendezvousState:
    state = dr._RendezvousState()
    a, b, c = dr._NodeDesc("10.0.0.1", 11, 0), dr._NodeDesc("fd00::2", 12, 1), dr._NodeDesc("h3.lan", 13, 2)
    when = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
    state.round, state.complete, state.closed, state.deadline = 4, True, False, when
    state.participants, state.wait_list, state.redundancy_list = {a: 0, b: 1}, {c}, {b}
    state.last_heartbeats = {a: when, b: when - timedelta(seconds=3), c: when}
    return state


def test_every_field_round_trips_in_one_spelling() -> None:
    codec = entry.StateCodec(dr)
    state = populated()
    bits = codec.dumps(state)
    assert vars(codec.loads(bits)) == vars(state)
    assert codec.dumps(codec.loads(bits)) == bits  # torch compares the bytes it wrote with the store's


def crafted(**changes: object) -> bytes:
    data = json.loads(entry.StateCodec(dr).dumps(populated()))
    data.update(changes)
    return json.dumps(data).encode()


NODE = ["10.0.0.1", 11, 0]
REFUSED = [
    # nested tuples, no class at all: a whitelisting unpickler takes them, and hashing them crashes the reader
    (b"\x80\x04N" + b"\x85" * 200_000 + b".", "not JSON"),
    (b"[" * 100_000, "not JSON"),
    (b"1" * 5000, "not JSON"),
    (b"\xff\xfe{}", "not JSON"),
    (b" " * (entry.MAX_STATE_BYTES + 1), "not JSON of at most 1 MiB"),
    (b"[]", "not the fields of this torch's rendezvous state"),
    (crafted(extra=1), "not the fields of this torch's rendezvous state"),
    (crafted(round=True), "field 'round': not a whole number"),
    (crafted(round=-1), "field 'round': not a whole number"),
    (crafted(round=1 << 63), "field 'round': not a whole number"),
    (crafted(complete=1), "field 'complete': not true or false"),
    (crafted(deadline="2026-01-01T00:00:00"), "field 'deadline': a time without its zone"),
    (crafted(deadline="\x1b]0;pwned\x07"), "field 'deadline': not an ISO time"),
    (crafted(deadline=["2026"]), "field 'deadline': not a time"),
    (crafted(participants={"a": 0}), "field 'participants': not a list of [node, value] pairs"),
    (crafted(participants=[[{"addr": "a"}, 0]]), "field 'participants': a node is not [address, pid, local id]"),
    (crafted(participants=[[[1, 2, 3], 0]]), "field 'participants': a node is not [address, pid, local id]"),
    (crafted(participants=[[["x" * 2000, 1, 0], 0]]), "field 'participants': a node is not [address, pid, local id]"),
    (crafted(participants=[[NODE, 0], [NODE, 1]]), "field 'participants': a node is listed twice"),
    (crafted(participants=[[NODE, "0"]]), "field 'participants': not a whole number"),
    (crafted(wait_list={"a": 1}), "field 'wait_list': not a list"),
    (crafted(redundancy_list=[[["a", 1.5, 0]]]), "field 'redundancy_list': a node is not [address, pid, local id]"),
    (crafted(last_heartbeats=[[NODE, "2026-01-01T00:00:00"]]), "field 'last_heartbeats': a time without its zone"),
]


@pytest.mark.parametrize("bits,why", REFUSED, ids=[why + f"-{i}" for i, (_, why) in enumerate(REFUSED)])
def test_a_crafted_state_is_refused_with_a_reason_of_our_own_words(bits: bytes, why: str) -> None:
    with pytest.raises(entry.StateRefused) as refused:
        entry.StateCodec(dr).loads(bits)
    assert str(refused.value) == why


@pytest.mark.slow
def test_the_entry_point_refuses_in_one_line_naming_the_rendezvous_host(store: TCPStore, tmp_path: Path) -> None:
    """A real torchrun started as meshrun starts it, on a store that holds a planted state: it
    starts no worker, runs nothing, and says in its last line which host's store it was."""
    store.set("torch.rendezvous.r3", planted(tmp_path / "ran"))
    worker = tmp_path / "worker.py"
    worker.write_text(f"open({str(tmp_path / 'worker-ran')!r}, 'w')\n")
    done = subprocess.run(
        [sys.executable, "-m", layout.TORCHRUN_MODULE, layout.TORCHRUN_RDZV_HOST_FLAG, "h9", "--nnodes", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{store.port}", "--rdzv-id", "r3",
         "--rdzv-conf", "is_host=0", "--nproc-per-node", "1", "--max-restarts", "0", str(worker)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == layout.STATE_REFUSED_EXIT, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        f"meshrun: the rendezvous store on host 'h9' (127.0.0.1:{store.port}) holds a rendezvous state that no "
        "torchrun of this run wrote (not JSON): refused; a member of the run may be compromised")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "worker-ran").exists()


def test_the_entry_points_names_are_the_layouts() -> None:
    """The check ships deploy/host/torchrun.py to hosts that may have no meshrun, so it keeps its own copies."""
    assert (entry.HOST_FLAG, entry.STATE_REFUSED_EXIT, entry.EXIT_MARK_ENV) == (
        layout.TORCHRUN_RDZV_HOST_FLAG, layout.STATE_REFUSED_EXIT, layout.TORCHRUN_EXIT_MARK_ENV)


def test_torch_unpickles_store_contents_only_where_the_codec_stands_in() -> None:
    """The audit, kept true for the next torch: in torchrun's agent, launcher and rendezvous code,
    the only pickle use is dynamic_rendezvous's state (its `pickle` is the codec). Everything else
    they read from the store is JSON or plain bytes (role infos, assigned ranks, barriers)."""
    pattern = ("pickle", "Unpickler", "torch.load", "marshal", "_object(", "object_list", "dill")
    files = [*(TORCH_DISTRIBUTED / "elastic").rglob("*.py"), *(TORCH_DISTRIBUTED / "launcher").rglob("*.py"),
             TORCH_DISTRIBUTED / "run.py"]
    hits = {(str(f.relative_to(TORCH_DISTRIBUTED)), line.strip()) for f in files
            for line in f.read_text().splitlines()
            if any(p in line for p in pattern) and not line.strip().startswith("#")}
    where = "elastic/rendezvous/dynamic_rendezvous.py"
    assert hits == {(where, "import pickle"), (where, "state_bits = pickle.dumps(self._state)"),
                    (where, "self._state = pickle.loads(state_bits)"), (where, "except pickle.PickleError as exc:")}


# Generation 0's "torchrun": the store its agent watches is up until the watcher has seen it, then it
# goes down with this process, which ends as a torchrun that refused the state does.
REFUSING_HEAD = """import socket, sys
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
server.accept()[0].close()
server.close()
sys.exit(int(sys.argv[2]))
"""


def test_a_refused_state_ends_the_agents_run_without_moving_it_to_the_next_host(tmp_path: Path) -> None:
    """Its store goes down with the refusing torchrun, as a lost rendezvous host's would; the agent
    must not start the next generation (a fresh rendezvous) for it, and records the refusal's status."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    next_started = tmp_path / "generation-1-started"
    generations = [
        {"head": "h1", "endpoint": f"127.0.0.1:{port}",
         "torchrun": [sys.executable, "-c", REFUSING_HEAD, str(port), str(layout.STATE_REFUSED_EXIT)]},
        {"head": "h2", "endpoint": "127.0.0.1:1",
         "torchrun": [sys.executable, "-c", f"open({str(next_started)!r}, 'w')"]},
    ]
    done = subprocess.run([sys.executable, "-m", layout.AGENT_MODULE, "run", "--run-id", "r4", "--host", "h2",
                           "--heartbeat-timeout", "0", "--quiet", "--succession", json.dumps(generations), "--",
                           *generations[0]["torchrun"]], cwd=tmp_path, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == layout.STATE_REFUSED_EXIT, done.stdout + done.stderr
    assert not next_started.exists()
    record = json.loads((tmp_path / layout.host_dir("r4", "h2") / layout.EXIT_RECORD).read_text())
    assert (record["rc"], record["generation"]) == (layout.STATE_REFUSED_EXIT, 0)
