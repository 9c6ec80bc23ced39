"""FSDP2 (`torch.distributed.fsdp.fully_shard`) over seqlm models: 2 real processes, CPU, gloo on loopback.

What docs/scaling.md says a model too large for one device would use. Each rank holds half of every
parameter; one SGD step of 2 ranks x B rows must give the weights that one unsharded process gets from
the same step on 2B rows (the reference, computed on rank 0 with the plain model), for the FNN and
the class-output RNN, through seqlm's own batches and step functions. torch 2.13 (CPU build) runs
fully_shard on CPU with gloo; the test is skipped, with the reason, on a torch that cannot.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from seqlm.config import TrainConfig
from seqlm.data.corpus import build_vocab_and_encode
from seqlm.models.fnn import FNNConfig
from seqlm.models.rnn import RNNConfig
from seqlm.registry import FAMILIES

from conftest import free_port, write_corpus

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # FSDP2 is public from torch 2.6
    fully_shard = None

B, LR = 2, 0.2  # rows per rank, SGD learning rate


def _config(name: str, rows: int):
    train = TrainConfig(batch_size=rows, seq_len=12, threads=1)
    return (RNNConfig if name == "rnn" else FNNConfig)(hidden=16, embed=8, train=train)


def _one_step(name: str, vocab, stream, rows: int, shard: tuple[int, int], mesh) -> tuple[torch.nn.Module, int]:
    """The model after one SGD step from the seed-0 weights on this shard's first batch (sharded when mesh)."""
    fam = FAMILIES[name]
    cfg = _config(name, rows)
    torch.manual_seed(0)
    model = fam.build(cfg, vocab)
    full = sum(p.numel() for p in model.parameters())
    if mesh is not None:
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batch = next(iter(fam.batches(cfg, vocab)(stream, np.random.default_rng([1, 1]), shard)))
    loss, _, _ = fam.step(model, batch, None)
    loss.backward()  # FSDP2: gradients reduce-scattered (averaged over ranks), each rank keeps its shard's
    opt.step()
    return model, full


def _worker(rank: int, world: int, port: int, corpus: str, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo",
                       "SEQLM_CACHE": str(Path(out) / f"cache{rank}")})
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh

    tdist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    vocab, train = build_vocab_and_encode(Path(corpus) / "train.txt")
    report = {}
    for name in ("fnn", "rnn"):
        model, full = _one_step(name, vocab, train, B, (rank, world), mesh)
        local = sum(p.to_local().numel() for p in model.parameters())  # this rank's shard
        gathered = {k: p.full_tensor().detach() for k, p in model.named_parameters()}  # collective: all ranks
        entry = {"local_fraction": local / full}
        if rank == 0:
            ref, _ = _one_step(name, vocab, train, B * world, (0, 1), None)
            entry["max_rel_diff"] = max(float((gathered[k] - p.detach()).abs().max() / (p.detach().abs().max() + 1e-12))
                                        for k, p in ref.named_parameters())
            torch.manual_seed(0)
            init = FAMILIES[name].build(_config(name, B), vocab)  # the weights before the step
            entry["step_size"] = max(float((p.detach() - q.detach()).abs().max())
                                     for p, q in zip(ref.parameters(), init.parameters()))
        report[name] = entry
    (Path(out) / f"report{rank}.json").write_text(json.dumps(report))
    tdist.barrier()
    tdist.destroy_process_group()


@pytest.mark.skipif(fully_shard is None, reason=f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard")
@pytest.mark.skipif(not tdist.is_available() or not tdist.is_gloo_available(), reason="torch built without gloo")
def test_fully_shard_two_ranks_equal_one_process_with_twice_the_batch(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    mp.spawn(_worker, args=(2, free_port(), str(corpus), str(tmp_path)), nprocs=2, join=True)
    reports = [json.loads((tmp_path / f"report{r}.json").read_text()) for r in (0, 1)]
    for name in ("fnn", "rnn"):
        assert reports[0][name]["step_size"] > 1e-3, (name, reports[0][name])  # the step did move the weights
        assert reports[0][name]["max_rel_diff"] < 1e-5, (name, reports[0][name])
        for r in reports:  # each rank holds about half of the parameters (dim-0 shards, padded)
            assert 0.4 < r[name]["local_fraction"] <= 0.55, (name, r[name])
