"""What bench/kn_scale.py, kn_big.py and kn_speed.py share: a program or a worker step run in a fresh process
with its wall time and peak RSS measured, and KenLM's tools found. It imports none of them, so each imports
it and the imports go one way (kn_scale -> kn_big -> here); a worker step is started as a program.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KN_SCALE = Path(__file__).resolve().parent / "kn_scale.py"  # its --worker STEP runs one step (kn_big's too)


def rss_mb() -> float:
    """This process's peak RSS so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024



GNU_TIME = Path("/usr/bin/time")


def run_measured(cmd: list[str], stdin: Path | None = None, stdout: Path | None = None) -> tuple[float, float, str]:
    """Run cmd; (wall seconds, peak RSS MB of that program alone, its stdout unless redirected).

    The peak comes from GNU time, which starts the program from its own small process: Linux keeps a
    process's peak RSS across exec, so a program started straight from this (large) Python process
    would report at least this process's RSS. Without GNU time the peak is wait4's and says so."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile() as peak:
        fin = open(stdin, "rb") if stdin else subprocess.DEVNULL
        fout = open(stdout, "wb") if stdout else out
        timed = GNU_TIME.is_file()
        full = [str(GNU_TIME), "-f", "%M", "-o", peak.name, *cmd] if timed else cmd
        t0 = time.perf_counter()
        p = subprocess.Popen(full, stdin=fin, stdout=fout, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        for f in (fin, fout):
            if f not in (subprocess.DEVNULL, out):
                f.close()
        if p.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {err.read().decode(errors='replace')[-2000:]}")
        rss = int(Path(peak.name).read_text().split()[-1]) / 1024 if timed else float("nan")
        out.seek(0)
        return wall, rss, out.read().decode()


def worker(step: str, **kw) -> tuple[dict, float, float]:
    """Run kn_scale.py --worker STEP --KEY VALUE... in a fresh process: (its JSON result, wall seconds, peak RSS MB)."""
    cmd = [sys.executable, str(KN_SCALE), "--worker", step]
    for k, v in kw.items():
        if v is not None:
            cmd += [f"--{k}", str(v)]
    wall, rss, out = run_measured(cmd)
    return json.loads(out.strip().splitlines()[-1]), wall, rss


def kenlm_bin() -> Path | None:
    for cand in [os.environ.get("KENLM_BIN"), *os.environ.get("PATH", "").split(os.pathsep),
                 "/work/shared/tools/kenlm"]:
        if cand and (Path(cand) / "lmplz").is_file():
            return Path(cand)
    return None
