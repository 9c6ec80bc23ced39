"""`make bench`: every benchmark in turn (each resumes its unfinished rows), then RESULTS.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["kn_ptb.py", "smoothing.py", "fofe_ptb.py", "fofe_alpha.py", "fofe_speed.py", "fofe_collisions.py",
           "rnnlm_ptb.py", "rnn_speed.py", "ddp.py", "advance.py", "export.py", "shared_memory.py"]

for script in SCRIPTS:
    if (HERE / script).exists():
        print(f"== {script}", flush=True)
        subprocess.run([sys.executable, str(HERE / script), *sys.argv[1:]], check=True)
subprocess.run([sys.executable, str(HERE / "render.py")], check=True)
