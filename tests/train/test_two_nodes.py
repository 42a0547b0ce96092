"""Two "nodes" on one machine form one job: two torchrun invocations with
``--nnodes 2`` rendezvous on 127.0.0.1 into world size 4 (SP = 2 x DP = 2),
and train exactly as one node with 4 processes does.

Tolerance 1e-6 relative: both runs have the same layout, so the same ranks do
the same arithmetic; only the transport differs (gloo over TCP either way, the
same ring algorithm), so the losses agree to the last few bits. A rank-order
mix-up between nodes (wrong data shard, wrong SP neighbour) changes the loss in
the first step by far more.
"""

from __future__ import annotations

import pytest

from plsh_dist.distributed.ports import free_port
from tests.train.conftest import base_overrides
from tests.train.launcher_runs import Launch, empty_config, launcher_env, logged_losses, run, torchrun_cmd

REL = 1e-6
# torchrun start-up + 4 tiny ranks on 2 busy cores: about a minute each.
BOUND_S = 300
LAYOUT = ["--parallel.sp_size=2", "--data.micro_batch_size=2", "--attention.bias=plsh",
          "--attention.num_samples=2", "--run.max_steps=3"]


@pytest.mark.slow
def test_two_nodes_on_one_machine_match_one_node(tiny_data, tmp_path):
    config = empty_config(tmp_path)
    env = launcher_env()

    one_out = tmp_path / "one_node"
    one = run(torchrun_cmd(4, config, base_overrides(tiny_data, one_out, *LAYOUT)), env, tmp_path, "one_node",
              timeout_s=BOUND_S)
    assert one.returncode == 0, one.stderr[-3000:]

    # Both nodes write to one out_dir, as nodes on a shared filesystem do; rank 0 logs.
    two_out = tmp_path / "two_nodes"
    port = free_port()
    nodes = [Launch(torchrun_cmd(2, config, base_overrides(tiny_data, two_out, *LAYOUT), nnodes=2, node_rank=r,
                                 port=port), env, tmp_path, f"node{r}") for r in (0, 1)]
    done = [node.wait(BOUND_S) for node in nodes]
    for r, res in enumerate(done):
        assert res.returncode == 0, f"node {r}: {res.stderr[-3000:]}"
    assert "world_size=4 = dp_size=2 x sp_size=2" in done[0].stdout  # one job, not two of 2

    ref, got = logged_losses(one_out), logged_losses(two_out)
    assert len(ref) == len(got) == 3
    assert got == pytest.approx(ref, rel=REL)
