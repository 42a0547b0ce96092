"""The whole model under sequence parallelism (CPU, gloo): global positions and
the SP group reach every layer's attention, so each rank's logits are the
single-process logits of its chunk and the chunks' gradients add up to the
full sequence's, for every bias mode."""

import torch.multiprocessing as mp

from tests.models import sp_model_worker


def test_model_under_sp_matches_single_process(tmp_path):
    world = 2  # the model plumbing does not depend on the world size; the ops' SP tests vary it
    mp.spawn(sp_model_worker.run, args=(world, str(tmp_path / "rendezvous")), nprocs=world, join=True)
