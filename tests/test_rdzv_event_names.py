"""torch's rendezvous names its events from the frame, not `inspect.stack()`
(deploy/host/torchrun.py `quick_event_names`): the same name at every depth, and a real c10d
rendezvous records the same events under the same names as with torch's own helper."""

from __future__ import annotations

import json
import logging
import types

import pytest
from torch.distributed.elastic import events
from torch.distributed.elastic.events import handlers
from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
from torch.distributed.elastic.rendezvous import registry

from meshrun.deploy.host import torchrun as entry
from tests.trainer.harness import free_port

SHIPPED = dynamic_rendezvous.get_method_name


def _record(namer, depth: int | None):
    """As torch's `_record`: asks for the name of the method that called it."""
    return namer() if depth is None else namer(depth)


def _add_to_participants(namer, depth: int | None = None):
    return _record(namer, depth)


def test_the_quick_name_is_torchs_at_every_depth() -> None:
    module = types.SimpleNamespace(get_method_name=SHIPPED)
    assert entry.quick_event_names(module)
    quick = module.get_method_name
    assert quick is not SHIPPED
    assert _add_to_participants(quick) == _add_to_participants(SHIPPED) == "_add_to_participants"
    for depth in (0, 1, 2, 3):
        assert _add_to_participants(quick, depth) == _add_to_participants(SHIPPED, depth)
    assert _add_to_participants(quick, 1) == "_record"
    assert _add_to_participants(quick, 10_000) == _add_to_participants(SHIPPED, 10_000) == "no_method_name"
    assert entry.quick_event_names(module) and module.get_method_name is quick  # installed once


def test_a_torch_without_the_helper_is_left_as_it_is() -> None:
    module = types.SimpleNamespace()
    assert not entry.quick_event_names(module)
    assert not hasattr(module, "get_method_name")


class _Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.names.append(json.loads(record.getMessage())["name"])


def _one_node_rendezvous(run_id: str) -> list[str]:
    """A real c10d rendezvous of one node (its own TCPStore), events recorded: their names."""
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id=run_id, min_nodes=1,
                                  max_nodes=1, is_host=True, local_addr="127.0.0.1")
    seen = _Events()
    logger = events._get_or_create_logger("dynamic_rendezvous")
    logger.addHandler(seen)
    try:
        handler = registry.get_rendezvous_handler(params)
        try:
            handler.next_rendezvous()
        finally:
            handler.shutdown()
    finally:
        logger.removeHandler(seen)
    return seen.names


def test_a_real_rendezvous_records_the_same_event_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # Events are recorded only when someone listens (torch's default handler is a NullHandler).
    monkeypatch.setitem(handlers._log_handlers, "dynamic_rendezvous", logging.StreamHandler())
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", SHIPPED)  # restored after the test
    torchs = _one_node_rendezvous("names-torch")
    assert entry.quick_event_names(dynamic_rendezvous)
    assert dynamic_rendezvous.get_method_name is not SHIPPED
    quick = _one_node_rendezvous("names-quick")
    assert "dynamic_rendezvous.py:_DistributedRendezvousOpExecutor._add_to_participants" in torchs
    assert any(name.endswith("DynamicRendezvousHandler.next_rendezvous") for name in torchs)
    assert not any("no_method_name" in name for name in torchs + quick)
    # The keep-alive timer may add an event to one run and not the other: the names, not their count.
    assert set(quick) == set(torchs)
