"""Data-parallel training (torch.distributed, gloo on CPU) with 2 real processes on loopback.

- 2 ranks x batch B take exactly the gradient step of 1 process x batch 2B, for every neural family;
- only rank 0 writes files; the ranks stay in step when one has an extra batch or a NaN loss;
- `seqlm train --nproc 2` and `torchrun -m seqlm train` work end to end, and --resume under DDP ends
  where an uninterrupted DDP run ends;
- the learning-rate schedule is decided on rank 0 (its validation perplexity, broadcast).
Every worker must also exit with status 0: the gloo teardown trap (see seqlm.train.distributed) shows
up as a worker aborting after its work is done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from seqlm.config import TrainConfig
from seqlm.data.corpus import build_vocab_and_encode, encode_file
from seqlm.models.fnn import FNNConfig
from seqlm.models.fofe import FOFEConfig
from seqlm.models.rnn import RNNConfig
from seqlm.registry import FAMILIES

from conftest import TINY, cli_env, free_port, seqlm_cli, write_corpus

B = 2  # rows per rank


def _config(name: str, rows: int):
    train = TrainConfig(batch_size=rows, seq_len=12, threads=1, max_epochs=2, lr=0.2)
    if name == "rnn":
        return RNNConfig(hidden=16, embed=8, train=train)
    return (FNNConfig if name == "fnn" else FOFEConfig)(hidden=16, embed=8, train=train)


def _first_step_grads(name: str, vocab, stream, rows: int, shard: tuple[int, int], wrap) -> dict[str, np.ndarray]:
    """Gradients after one training step from the seed-0 initial weights on this shard's first batch."""
    fam = FAMILIES[name]
    cfg = _config(name, rows)
    torch.manual_seed(0)
    model = fam.build(cfg, vocab)
    net = wrap(model)
    batch = next(iter(fam.batches(cfg, vocab)(stream, np.random.default_rng([1, 1]), shard)))
    loss, _, _ = fam.step(net, batch, None)
    loss.backward()
    grads = {k: p.grad.detach().clone().numpy() for k, p in model.named_parameters()}
    del net, loss  # the DDP wrapper must be gone before the process group (see Context.finish)
    return grads


def _worker(rank: int, world: int, port: int, corpus: str, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo",
                       "SEQLM_CACHE": str(Path(out) / f"cache{rank}")})
    torch.set_num_threads(1)
    import torch.distributed as tdist

    import seqlm.checkpoint as ckpt
    from seqlm.train import distributed as dist
    from seqlm.train import loop

    corpus_dir, out_dir = Path(corpus), Path(out)
    vocab, train = build_vocab_and_encode(corpus_dir / "train.txt")
    valid = encode_file(corpus_dir / "valid.txt", vocab)
    # This worker owns the process group, so the fit() calls below join it and leave it up.
    tdist.init_process_group("gloo")
    ctx = dist.setup(torch.device("cpu"))

    # 1. gradient equivalence, every neural family; rank 0 also computes the 1-process reference
    report: dict = {}
    for name in ("fnn", "fofe", "rnn"):
        got = _first_step_grads(name, vocab, train, B, ctx.shard, ctx.wrap)
        if rank == 0:
            ref = _first_step_grads(name, vocab, train, B * world, (0, 1), lambda m: m)
            report[name] = {k: float(np.max(np.abs(got[k] - ref[k])) / (np.max(np.abs(ref[k])) + 1e-12))
                            for k in ref}

    # 2. fit() under DDP with uneven shards (rank 0 has one batch more) and a NaN loss on rank 1 only,
    # in the first try of epoch 1; a record of which rank writes files; 2 epochs straight vs 1 + resume.
    writes: list[str] = []
    real_atomic_path = ckpt.atomic_path

    def recording_atomic_path(path):
        writes.append(Path(path).name)
        return real_atomic_path(path)

    ckpt.atomic_path = recording_atomic_path
    fam = FAMILIES["fnn"]
    base = fam.batches(_config("fnn", B), vocab)

    def uneven(stream, rng, shard):
        batches = list(base(stream, rng, shard))
        return iter(batches if shard[0] == 0 else batches[:-1])

    def run(run_dir: Path, epochs: int, resume: bool = False) -> tuple[list[dict], torch.nn.Module]:
        cfg = _config("fnn", B)
        cfg.train.max_epochs = epochs
        torch.manual_seed(0)
        model = fam.build(cfg, vocab)
        calls = {"n": 0}

        def step(net, batch, state):
            calls["n"] += 1
            loss, state, n = fam.step(net, batch, state)
            if rank == 1 and calls["n"] == 3 and not resume:
                loss = loss * float("nan")
            return loss, state, n

        def save_best(m):
            ckpt.save_tensors(run_dir / ckpt.WEIGHTS, m.state_dict())

        run_dir.mkdir(exist_ok=True)
        return loop.fit(model, step, uneven, train, valid, cfg.train, run_dir, save_best, resume), model

    history, model = run(out_dir / "whole", 2)
    report.update(epochs=[h["epoch"] for h in history], lrs=[h["lr"] for h in history],
                  valid=[h["valid_ppl"] for h in history],
                  weights=[p.detach().double().sum().item() for p in model.parameters()])
    run(out_dir / "split", 1)
    history, model = run(out_dir / "split", 2, resume=True)
    report.update(resumed_valid=[h["valid_ppl"] for h in history],
                  resumed_weights=[p.detach().double().sum().item() for p in model.parameters()],
                  writes=list(writes))

    # 3. The schedule decision (halve, stop) is rank 0's: rank 1's own validation, made to disagree, is unused.
    if rank == 1:
        loop.evaluate = lambda *args, **kwargs: {"ppl": 1e6}
    history, model = run(out_dir / "decide", 4)
    report.update(decide=[(h["lr"], h["valid_ppl"], h["lr_halved"]) for h in history],
                  decide_weights=[p.detach().double().sum().item() for p in model.parameters()])
    (out_dir / f"report{rank}.json").write_text(json.dumps(report))
    # The teardown order that keeps gloo from aborting at exit (see seqlm.train.distributed.Context.finish)
    del model
    ctx.owns_group = True
    ctx.finish()


def test_two_ranks_equal_one_process_with_twice_the_batch(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_train=120, n_eval=10)
    out = tmp_path / "out"
    out.mkdir()
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, str(corpus), str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0, 0], f"worker exit codes {codes} (negative: killed by a signal, e.g. the gloo abort)"
    r0, r1 = (json.loads((out / f"report{r}.json").read_text()) for r in range(2))
    for name in ("fnn", "fofe", "rnn"):
        worst = max(r0[name].values())
        assert worst < 1e-5, f"{name}: gradients differ from the 1-process batch-2B step (rel. {worst:g})"
    # Files: rank 0 wrote the weights and the resume state every epoch (2 + 1 + 1), rank 1 nothing.
    assert r1["writes"] == []
    assert r0["writes"].count("state.safetensors") == 4 and "weights.safetensors" in r0["writes"]
    # Both ranks saw the NaN (only rank 1 had it), restored, halved the rate and finished both epochs alike.
    assert r0["epochs"] == r1["epochs"] == [1, 2]
    assert r0["lrs"][0] == r1["lrs"][0] == pytest.approx(0.1)
    assert r0["weights"] == r1["weights"]
    # --resume under DDP ends exactly where the uninterrupted DDP run ends.
    assert r0["resumed_valid"] == r0["valid"] and r0["resumed_weights"] == r0["weights"]
    assert r1["resumed_weights"] == r1["weights"]
    # One schedule for all ranks: rank 0's validation perplexity decided it on both.
    assert r0["decide"] == r1["decide"] and r0["decide_weights"] == r1["decide_weights"]
    assert all(valid != 1e6 for _, valid, _ in r1["decide"]) and any(h for *_, h in r0["decide"])


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_cli_nproc_then_torchrun_resume(tmp_path):
    """`seqlm train --nproc 2` for one epoch, then `torchrun ... -m seqlm train --resume` for the second."""
    corpus = write_corpus(tmp_path / "corpus", n_train=120, n_eval=10)
    out = tmp_path / "model"
    args = ["--model", "fofe", "--data", corpus, "--out", out, "--seq-len", "12", "--batch-size", "2", *TINY]
    first = seqlm_cli("train", *args, "--max-epochs", "1", "--nproc", "2")
    assert first.returncode == 0, first.stderr
    assert len(first.stdout.strip().splitlines()) == 1  # one result line, not one per rank
    assert [r["epoch"] for r in _metrics(out)] == [1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "seqlm", "train",
           *map(str, args), "--max-epochs", "2", "--resume"]
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=cli_env())
    assert second.returncode == 0, second.stderr
    rows = _metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2]
    result = json.loads(second.stdout)  # rank 0 alone prints the result line
    assert result["valid_ppl"] == pytest.approx(min(r["valid_ppl"] for r in rows))
    # Rank 0 alone wrote the directory: no leftovers of a second writer (temporary files) anywhere.
    assert not [p for p in out.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
