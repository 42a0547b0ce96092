"""A decoder layer under sequence parallelism compiles to one graph (``fullgraph=True``, zero breaks)
for every bias, with outputs and gradients equal to the eager SP layer's, and every rank issues the
same collectives in the same order, compiled or not (CPU, gloo; :mod:`tests.distributed.sp_compile_worker`).

``aot_eager`` traces what inductor sees (dynamo, the fake kernels, AOTAutograd) without its C++ code
generation; inductor itself runs once, on PLSH."""

import pytest
import torch.multiprocessing as mp

from tests.distributed import sp_compile_worker

ALL = list(sp_compile_worker.BIASES)


def _spawn(tmp_path, world, names, dtype="float32", documents=False, backend="aot_eager"):
    mp.spawn(sp_compile_worker.run, args=(world, str(tmp_path / "rendezvous"), names, dtype, documents, backend),
             nprocs=world, join=True)


def test_every_bias_compiles_under_sp2(tmp_path):
    _spawn(tmp_path, 2, ALL)


@pytest.mark.slow
def test_packed_documents_compile_under_sp2(tmp_path):
    _spawn(tmp_path, 2, ["plsh_onepass", "alibi", "truncated"], documents=True)


@pytest.mark.slow
def test_bf16_compiles_under_sp2(tmp_path):
    _spawn(tmp_path, 2, ["plsh_per_sample", "window"], dtype="bfloat16")


@pytest.mark.slow
def test_every_bias_compiles_under_sp4(tmp_path):
    _spawn(tmp_path, 4, ALL)


@pytest.mark.slow
def test_bf16_and_documents_under_sp4(tmp_path):
    _spawn(tmp_path, 4, ALL, dtype="bfloat16", documents=True)


@pytest.mark.slow
def test_inductor_compiles_an_sp_layer(tmp_path):
    _spawn(tmp_path, 2, ["plsh_onepass"], backend="inductor")


@pytest.mark.slow
def test_public_sp_ops_compile_with_every_argument_form(tmp_path):
    mp.spawn(sp_compile_worker.run_public_ops, args=(2, str(tmp_path / "rendezvous")), nprocs=2, join=True)
