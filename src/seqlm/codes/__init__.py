"""Word embeddings and the sparse codes made from them: `seqlm embed` (embed.py) and `seqlm sparse-codes`
(sparse_codes.py). The layers that use the codes live in seqlm.nn.sparse_code."""
