"""Sampling sentences from any LanguageModel through its `step` method."""

from __future__ import annotations

import torch

from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import model_device
from seqlm.protocol import LanguageModel


@torch.no_grad()
def sample(model: LanguageModel, num: int, seed: int = 0, temperature: float = 1.0,
           max_len: int = 100) -> list[list[str]]:
    """Draw `num` sentences in parallel; each ends at `</s>` (not shown) or after `max_len` words."""
    if num < 1 or max_len < 1:
        raise SeqlmError("--num and --max-len must be at least 1")
    if temperature <= 0:
        raise SeqlmError(f"--temperature must be positive, got {temperature}")
    if hasattr(model, "eval"):
        model.eval()
    vocab = model.vocab
    gen = torch.Generator().manual_seed(seed)
    device = model_device(model)
    tokens = torch.full((num,), vocab.bos_id, dtype=torch.long, device=device)
    state = model.initial_state(num)
    out: list[list[int]] = [[] for _ in range(num)]
    done = torch.zeros(num, dtype=torch.bool)
    for _ in range(max_len):
        logp, state = model.step(tokens, state)  # (num, V)
        logits = logp.float().cpu() / temperature
        if vocab.bos_id != vocab.eos_id:
            logits[:, vocab.bos_id] = -torch.inf  # <s> is context only
        nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen).squeeze(1)  # (num,)
        for i in range(num):
            if not done[i]:
                if int(nxt[i]) == vocab.eos_id:
                    done[i] = True
                else:
                    out[i].append(int(nxt[i]))
        if bool(done.all()):
            break
        tokens = nxt.to(device)
    return [vocab.decode(ids) for ids in out]
