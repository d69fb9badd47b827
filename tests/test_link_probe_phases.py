"""The link probe's two phases (deploy/host/links.py `connect`), real processes on loopback:
the handshakes (RTT, no transfer), then, asked separately once every host's handshakes are done,
the timed transfers alone (deploy/edges/check_probes.py `probe_pairs`)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.test_probe_listener import LINKS, TRAINING, free_port, listener


def probe(spec: dict) -> list[dict]:
    out = subprocess.run([sys.executable, str(LINKS), "connect", json.dumps(spec)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_handshakes_then_transfers_alone() -> None:
    closed = free_port()
    with listener(None, 60) as answer:
        targets = [{"name": "peer", "address": TRAINING, "port": answer["port"]},
                   {"name": "gone", "address": TRAINING, "port": closed}]
        shakes = probe({"targets": targets, "timeout": 3, "df_size": None, "bandwidth_s": 0.0})
        assert [r["state"] for r in shakes] == ["open", "refused"]
        assert shakes[0]["connect_ms"] >= 0 and all("mbit_s" not in r for r in shakes)
        rates = probe({"targets": targets, "timeout": 3, "df_size": None, "bandwidth_s": 0.5, "bulk_only": True})
    assert [r["state"] for r in rates] == ["open", "error"]
    assert rates[0]["mbit_s"] > 0 and rates[1]["mbit_s"] is None
    assert [r["detail"] for r in rates] == ["", "Connection refused"]  # why a transfer could not be timed
    assert all(set(r) == {"state", "mbit_s", "detail"} for r in rates)  # no handshake timed in this phase
