"""Namespace hosts for the cluster tests (``make test-cluster``; root, sshd/pdsh, Slurm).

A fixture that cannot build its hosts skips the test with the missing
capability in the reason (namespaces refused, a package missing: ``make
cluster-deps``); pytest's ``-ra`` lists the reasons. Under CI (``CI=true``,
.ci/run installs everything first) that is a failure instead: a skipped
cluster test would leave CI green with nothing checked. Everything they
start runs inside the hosts and dies with them at the end of the module.
"""

from __future__ import annotations

import os

import pytest


def unavailable(reason: str) -> None:
    """Skip, or under CI fail, naming what the cluster lacks."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"cluster unavailable under CI: {reason}")
    pytest.skip(f"cluster unavailable: {reason}")

from tools.cluster.hosts import ClusterUnavailable
from tools.cluster.ssh import ssh_hosts


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Two hosts, node-0 and node-1, with root ssh (keys made for them) between them."""
    try:
        with ssh_hosts(2, tmp_path_factory.mktemp("cluster")) as two:
            yield two
    except ClusterUnavailable as err:
        unavailable(str(err))
