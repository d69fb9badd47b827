"""Shared fixtures. Test bed fixtures: a simulated 3-host SSH cluster
(tests/testbed) shared by the whole session, and fresh inventories per test."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# `python -m pytest` puts the repo root on sys.path, the `pytest` script does
# not; make `tests.testbed` (also `python -m tests.testbed`) importable in both.
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tests.testbed import SimCluster, layout, missing_requirements  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402
from tests.testbed.zerotier import ZeroTier  # noqa: E402

TESTBED_HOSTS = 3
# CI sets this: a test bed that cannot come up is then a failure, not a skip.
REQUIRE_ENV = "MESHRUN_REQUIRE_TESTBED"
STATE_DIR_ENV = "MESHRUN_TESTBED_STATE"


def _testbed_unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"simulated cluster required ({REQUIRE_ENV}=1) but: {reason}", pytrace=False)
    pytest.skip(f"simulated cluster unavailable: {reason}")



@pytest.fixture(autouse=True)
def _hints_repeat_no_flags_after_a_test() -> Iterator[None]:
    """A task called through `guarded` (deploy/cli.py) makes later hints repeat its --inventory and
    --project (deploy/render/console.repeat_in_hints): one process's state, so a test calling a task
    would change the hints of the tests after it in the same worker."""
    yield
    from meshrun.deploy.render.console import repeat_in_hints
    repeat_in_hints({})

@pytest.fixture(scope="session")
def testbed() -> Iterator[SimCluster]:
    """3 simulated hosts h1..h3 (no overlay), up for the whole session.

    Tests must leave it as they found it: heal cuts and unshape in a finally
    (`with testbed.link_cut(2):`, `with testbed.shaped("20mbit"):`).
    """
    missing = missing_requirements(wireguard=True)
    if missing:
        _testbed_unavailable("; ".join(missing))
    cluster = SimCluster(os.environ.get(STATE_DIR_ENV, str(layout.DEFAULT_STATE_DIR)))
    # Another pytest session on this machine would tear our hosts down: wait.
    with exclusive():
        cluster.up(TESTBED_HOSTS)
        try:
            yield cluster
        finally:
            report = cluster.down()
            if report.leftovers:  # an orphan on a real host would hold its GPU: a failure, not a warning
                pytest.fail("test bed down() had to SIGKILL processes left in the hosts: "
                            + "; ".join(f"{ns} pid {p.pid} {' '.join(p.argv)}" for ns, p in report.leftovers),
                            pytrace=False)


@contextmanager
def hosts_up(cluster: SimCluster, n: int) -> Iterator[SimCluster]:
    """The session's test bed with n hosts for a while, then the hosts the rest of the session expects."""
    cluster.up(n)
    try:
        yield cluster
    finally:
        cluster.up(TESTBED_HOSTS)


@pytest.fixture
def testbed_wg(testbed: SimCluster) -> Iterator[SimCluster]:
    """The shared cluster with the wireguard-go overlay up for one test."""
    testbed.wireguard_up()
    try:
        yield testbed
    finally:
        testbed.wireguard_down()


@pytest.fixture(scope="session")
def zt_session(request: pytest.FixtureRequest) -> Iterator[ZeroTier]:
    """The real ZeroTier One daemon on h1..h3 of the shared cluster (h1: private planet root and
    network controller), 10.79.0.1x on ztmrt0; up from the first test that asks until the end of
    the session, so those tests share one network. Skips (fails under MESHRUN_REQUIRE_TESTBED=1)
    where the zerotier-one binary is missing."""
    missing = missing_requirements(wireguard=False, zerotier=True)
    if missing:  # before the cluster: a skip costs nothing
        _testbed_unavailable("; ".join(missing))
    testbed: SimCluster = request.getfixturevalue("testbed")
    overlay = testbed.zerotier
    overlay.up()
    try:
        yield overlay
    finally:
        overlay.down()


@pytest.fixture
def zt_testbed(zt_session: ZeroTier) -> ZeroTier:
    """The session's ZeroTier network, healthy at the start of the test: every daemon running,
    every member authorized, ~/bin/zerotier-cli in place (a stand-in test may have replaced it),
    every node OK and every pair pinging. A test that breaks something repairs it in a finally."""
    zt_session.repair()
    return zt_session


@pytest.fixture
def make_inventory(testbed: SimCluster, tmp_path: Path) -> Callable[..., Path]:
    """Factory: make_inventory(**write_inventory kwargs) -> a new inventory path
    under tmp_path (with its own known_hosts next to it)."""
    count = 0

    def make(**kwargs: Any) -> Path:
        nonlocal count
        count += 1
        return testbed.write_inventory(tmp_path / f"inventory{count}.yaml", **kwargs)

    return make


@pytest.fixture
def inventory(make_inventory: Callable[..., Path]) -> Path:
    """A fresh default inventory for the shared cluster (lan)."""
    return make_inventory()


@pytest.fixture
def zt_inventory(zt_testbed: ZeroTier, make_inventory: Callable[..., Path]) -> Path:
    """A fresh inventory on the real ZeroTier addresses (network: zerotier; SSH over the LAN)."""
    return make_inventory(use_zerotier=True)


@pytest.fixture
def wg_inventory(testbed_wg: SimCluster, make_inventory: Callable[..., Path]) -> Path:
    """A fresh inventory with the overlay up (network: wireguard)."""
    return make_inventory()


# Fixtures that stand on a simulated cluster (one per slot of the machine; its flock allows one user).
CLUSTER_FIXTURES = frozenset({"testbed", "testbed_wg", "zt_session", "zt_testbed", "make_inventory",
                              "inventory", "zt_inventory", "wg_inventory"})
# A module marked `either_cluster` names no fixed address, namespace or overlay of slot 0: it runs on
# whichever cluster its worker has. The rest (fixed 10.77.0.x addresses, ZeroTier) run on slot 0.
EITHER_MARK = "either_cluster"
# A cluster module so heavy (16 or 32 simulated hosts importing torch) that a timed cluster test
# beside it starves: it runs on any slot while the other workers run pure tests only.
ALONE_MARK = "alone_cluster"
# A machine-only test that mostly waits (on a deadline, a stand-in host that never answers): little CPU,
# so it runs early, beside the cluster tests' CPU, not in the run's last minute with the cores idle.
WAITS_MARK = "waits"
# Either-cluster modules whose tests share nothing and each take a minute: units of one test, so
# the workers' clusters share them out.
SPLIT_MODULES = frozenset({"tests/test_elastic.py", "tests/test_comm_multihost.py", "tests/test_multihost.py",
                           "tests/test_check_network.py"})
# Where the workers list the cluster tests they collected, for the controller's scheduler.
CLUSTER_LIST_ENV = "MESHRUN_CLUSTER_TESTS_FILE"


def _on_the_cluster(item: pytest.Item) -> bool:
    """A test marked `cluster`, or one that asks for a cluster fixture (directly or not)."""
    return item.get_closest_marker("cluster") is not None or bool(
        set(getattr(item, "fixturenames", ())) & CLUSTER_FIXTURES)


def _either_cluster(item: pytest.Item) -> bool:
    return item.get_closest_marker(EITHER_MARK) is not None or _alone_cluster(item)


def _alone_cluster(item: pytest.Item) -> bool:
    return item.get_closest_marker(ALONE_MARK) is not None


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`tests/run` runs `-n 2 --dist loadgroup`), the controller names a file
    before its workers start (they inherit the environment) where they list the cluster tests."""
    config.addinivalue_line("markers", f"{EITHER_MARK}: a cluster test that runs on any slot's cluster")
    config.addinivalue_line("markers", f"{ALONE_MARK}: a cluster test that runs on any slot's cluster, "
                                       "beside no other cluster test")
    config.addinivalue_line("markers", f"{WAITS_MARK}: a test off the cluster that mostly waits: scheduled first")
    if getattr(config.option, "dist", "no") == "loadgroup" and not hasattr(config, "workerinput"):
        fd, path = tempfile.mkstemp(prefix="meshrun-cluster-tests-")
        os.close(fd)
        os.environ[CLUSTER_LIST_ENV] = path
        config.add_cleanup(lambda: os.unlink(path))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get(CLUSTER_LIST_ENV)
    if path and hasattr(config, "workerinput"):
        listed = "".join(f"{kind} {item.nodeid}\n" for item, kind in _cluster_kinds(items))
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False) as tmp:
            tmp.write(listed)
        os.replace(tmp.name, path)  # every worker collects the same tests: the same list


def _cluster_kinds(items: list[pytest.Item]) -> list[tuple[pytest.Item, str]]:
    """("0" slot 0 | "*" either cluster | "!" alone) for the cluster tests, "0" for the pure tests
    of a module that has slot-0 cluster tests (they compare slot 0's names and addresses exactly), and
    "~" for the other tests marked `waits`."""
    slot0 = {item.nodeid.split("::")[0] for item in items if _on_the_cluster(item) and not _either_cluster(item)}

    def kind(item: pytest.Item) -> str | None:
        if _on_the_cluster(item):
            return "!" if _alone_cluster(item) else "*" if _either_cluster(item) else "0"
        if item.nodeid.split("::")[0] in slot0:
            return "0"
        return "~" if item.get_closest_marker(WAITS_MARK) is not None else None

    return [(item, found) for item in items if (found := kind(item)) is not None]


def pytest_runtest_setup(item: pytest.Item) -> None:
    if layout.SLOT != 0 and _on_the_cluster(item) and not _either_cluster(item):
        pytest.fail(f"this test needs slot 0's cluster (its fixed addresses), but this process has slot "
                    f"{layout.SLOT}: run it in worker gw0 (tests/run's scheduler does)", pytrace=False)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Worker gwN stands on slot N's cluster (tests/testbed/layout.py). gw0 runs slot 0's cluster
    tests, module by module, while gw1 and gw2 run the either-cluster ones on their own clusters;
    gw0 takes the either-cluster ones left once its own are done, then all take the pure and
    single-machine tests. (xdist's own `xdist_group` mark cannot pin groups: xdist 3.8 renames the test through an
    attribute pytest 9 no longer reads, and a group's tests spread over both workers.)"""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return None
    from tests.clusterschedule import ClusterScheduling

    return ClusterScheduling(config, log, Path(os.environ[CLUSTER_LIST_ENV]), SPLIT_MODULES, len(layout.SLOTS))


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound on 127.0.0.1 but not listening, held for the test: a connect is refused at once."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]
