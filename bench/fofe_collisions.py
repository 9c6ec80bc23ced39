"""FOFE uniqueness (fofe-fnnlm.txt Sec. 2, Fig. 2): collisions among all binary sequences and in PTB.

    python bench/fofe_collisions.py [--max-len 20]

Runs `seqlm fofe-collisions` on the paper's grid: every sequence of exactly --max-len symbols over a
2-symbol vocabulary at epsilon 1e-2, 1e-3, 1e-4 and alpha 0.05..1.0, then every sentence prefix of PTB
train at epsilon 0.01 for alpha 0.55..1.0 (the paper saw no collision there). One row per grid point in
bench/results/fofe_collisions.json; the plot is bench/results/fofe_collisions.png.
"""

from __future__ import annotations

import argparse
import time

from seqlm.eval import fofe_collisions

from common import RESULTS, merge_rows, ptb_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-len", type=int, default=20)
    args = p.parse_args()
    t0 = time.time()
    res = fofe_collisions.run(max_len=args.max_len, corpus_path=ptb_dir() / "train.txt",
                              out_png=RESULTS / "fofe_collisions.png")
    sim, corpus = res["simulation"], res["corpus"]
    rows = [{"name": f"sim-T{args.max_len}-eps{eps}-a{a:g}", "kind": "simulation", "alpha": a, "epsilon": float(eps),
             "sequences": sim["n_sequences"], "colliding": n}
            for eps, counts in sim["collisions"].items() for a, n in zip(sim["alphas"], counts)]
    rows += [{"name": f"ptb-eps{corpus['epsilon']}-a{r['alpha']:g}", "kind": "ptb-train", "alpha": r["alpha"],
              "epsilon": corpus["epsilon"], "prefixes": corpus["n_prefixes"],
              "colliding": r["prefixes_involved"], "examples": r["examples"][:3]}
             for r in corpus["results"]]
    merge_rows("fofe_collisions", rows, {"simulation_seconds": sim["seconds"], "seconds": time.time() - t0})
    for r in rows:
        print(r["name"], r["colliding"])


if __name__ == "__main__":
    main()
