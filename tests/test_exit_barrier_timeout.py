"""torch's exit barrier gives up after 300 s, logs it and returns, and torchrun exits 0 as if every
peer had arrived; the controller takes the first status 0 of an elastic run for the end of
training and stops a peer still saving 30 s later (docs/elastic.md). In an attached run the agent
gives torchrun `ATTACHED_EXIT_BARRIER_S` (24 h) and meshrun's torchrun gives the barrier that
instead (deploy/host/torchrun.py `mark_exit_barrier`); a detached run, which no controller ends
early, keeps torch's 300 s.

A stand-in agent shows what the wrapper does; torch's own `SimpleElasticAgent` (imported, no
process, no store) shows that the attribute it sets is the one torch's barrier reads, so a torch
that renames it fails here rather than quietly waiting 300 s again.
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic.agent.server import api as server_api

from meshrun import layout
from meshrun.deploy.host import torchrun as entry
from meshrun.deploy.host.agentargs import parse, run_env

LONG = float(layout.ATTACHED_EXIT_BARRIER_S)


class StandInAgent:
    """Reads its timeout as torch's `SimpleElasticAgent._exit_barrier` does."""

    def __init__(self) -> None:
        self._exit_barrier_timeout = 300.0
        self.seen: list[float] = []

    def _exit_barrier(self) -> str:
        self.seen.append(self._exit_barrier_timeout)
        return "passed"


def stand_in_api(agent_class: type) -> Any:
    return types.SimpleNamespace(SimpleElasticAgent=agent_class)


def test_the_wrapped_barrier_waits_the_long_bound_and_marks_the_file(tmp_path: Path) -> None:
    class Agent(StandInAgent):
        pass

    mark = tmp_path / "exit-barrier"
    assert entry.mark_exit_barrier(stand_in_api(Agent), str(mark), LONG)
    agent = Agent()
    assert agent._exit_barrier() == "passed"
    assert agent.seen == [24 * 3600.0]
    assert mark.exists()


def test_without_a_bound_the_barrier_keeps_torchs_timeout(tmp_path: Path) -> None:
    """A detached run's torchrun (no bound in its environment): marked, torch's 300 s as they were."""
    class Agent(StandInAgent):
        pass

    assert entry.mark_exit_barrier(stand_in_api(Agent), str(tmp_path / "exit-barrier"), None)
    agent = Agent()
    agent._exit_barrier()
    assert agent.seen == [300.0] and (tmp_path / "exit-barrier").exists()


def test_only_an_attached_runs_agent_gives_torchrun_the_long_bound() -> None:
    """The agent's environment for torchrun: the bound where a controller heartbeats (it stops a
    peer that looks finished too early), none for a detached copy (`--heartbeat-timeout 0`), and
    none inherited from the agent's own environment either."""
    attached = parse(["run", "--run-id", "r1", "--host", "h1", "--", "python", "x.py"])
    detached = parse(["run", "--run-id", "r1", "--host", "h1", "--heartbeat-timeout", "0", "--", "python", "x.py"])
    attached.secret_env = detached.secret_env = {}  # the agent's main reads them from stdin
    env, _ = run_env(attached, "/tmp/mark")
    assert env[layout.TORCHRUN_EXIT_TIMEOUT_ENV] == str(24 * 3600) and env[layout.TORCHRUN_EXIT_MARK_ENV] == "/tmp/mark"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(layout.TORCHRUN_EXIT_TIMEOUT_ENV, "86400")
        env, _ = run_env(detached, "/tmp/mark")
    assert layout.TORCHRUN_EXIT_TIMEOUT_ENV not in env and env[layout.TORCHRUN_EXIT_MARK_ENV] == "/tmp/mark"
    assert entry.EXIT_TIMEOUT_ENV == layout.TORCHRUN_EXIT_TIMEOUT_ENV  # torchrun.py's copy of the name


def test_an_agent_without_the_attribute_keeps_its_own_timeout(tmp_path: Path) -> None:
    """A torch whose agent names it otherwise: nothing is invented on it (its barrier reads its own)."""
    class Agent:
        def _exit_barrier(self) -> str:
            return "passed"

    mark = tmp_path / "exit-barrier"
    assert entry.mark_exit_barrier(stand_in_api(Agent), str(mark), LONG)
    agent = Agent()
    assert agent._exit_barrier() == "passed"
    assert not hasattr(agent, entry.EXIT_BARRIER_TIMEOUT_ATTR) and mark.exists()


def test_torchs_barrier_reads_the_attribute_the_wrapper_sets() -> None:
    agent_class = server_api.SimpleElasticAgent
    init, barrier = inspect.getsource(agent_class.__init__), inspect.getsource(agent_class._exit_barrier)
    attr = f"self.{entry.EXIT_BARRIER_TIMEOUT_ATTR}"
    assert f"{attr} = exit_barrier_timeout" in init  # every agent has it, so the wrapper's hasattr holds
    assert f"barrier_timeout={attr}" in barrier.replace(" ", "").replace("\n", "")


def test_torchs_own_barrier_is_given_the_long_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's real `_exit_barrier` on a subclass (torch's class stays as it is), its store call
    recorded instead of made."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(server_api.store_util, "barrier", lambda *args, **kwargs: calls.append(kwargs))

    class Agent(server_api.SimpleElasticAgent):  # type: ignore[misc]
        pass

    Agent.__abstractmethods__ = frozenset()  # built by hand below: no worker spec, no rendezvous
    assert entry.mark_exit_barrier(stand_in_api(Agent), str(tmp_path / "exit-barrier"), LONG)
    agent = object.__new__(Agent)
    agent._exit_barrier_timeout, agent._store = 300, object()
    agent._worker_group = types.SimpleNamespace(state="SUCCEEDED", group_world_size=2)
    agent._exit_barrier()
    assert [c.get("barrier_timeout") for c in calls] == [LONG]
    assert server_api.SimpleElasticAgent._exit_barrier is not Agent._exit_barrier  # torch's own is untouched
    assert (tmp_path / "exit-barrier").exists()
