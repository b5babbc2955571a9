"""The launcher's Hydra callbacks (conf/config.yaml's hydra.callbacks): a run or a sweep never lands on
an earlier one's directory, and a command refused in a run's directory leaves it as it found it (its
files taken before Hydra writes there); a sweep's jobs' fork server starts with the sweep where its
set-up would hold the first job up. Run in the command's process, before Hydra writes anything."""
import sys
from collections import Counter
from pathlib import Path

from hydra.experimental.callback import Callback

from distrain.common import cpu
from distrain.common.errors import print_error
from distrain.common.rundir import RunDir
from distrain.common.topology import Topology
from distrain.config import schema
from distrain.launcher import forkserver
from distrain.report import results, tracking
from distrain.report.sweep import runs_jobs_apart


class KeepEarlierRuns(Callback):
    """Hydra callback (conf/config.yaml): a run into a directory that holds a run, or a sweep into one
    that holds a sweep, is refused before Hydra writes anything there, unless trainer.resume says to go
    on with it. (Hydra's default directories, named by the clock, never hold one.)"""

    def on_run_start(self, config, **kwargs) -> None:
        run_dir = Path(config.hydra.run.dir)
        earlier = earlier_run(RunDir(run_dir))
        if earlier is not None:  # (before Hydra rewrites its .hydra/ there: a refused command puts it back)
            _BEFORE[run_dir.resolve()] = RunDir(run_dir).snapshot()
        if earlier is None or config.trainer.resume:
            return
        if not Topology.of(config).local and RunDir(run_dir).ended() in (None, "running"):
            return  # the tasks of a real cluster may share a run directory, which each starts
        _refuse(f"hydra.run.dir={run_dir} holds a run already, which {earlier}: go on with it with "
                f"trainer.resume=true, set another hydra.run.dir, or remove {run_dir}")

    def on_multirun_start(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = [path.parent for path in sweep_dir.glob("*/config.yaml")]
        if jobs and not config.trainer.resume:
            ends = Counter(RunDir(job).ended() or "unrecorded" for job in jobs)
            _refuse(f"hydra.sweep.dir={sweep_dir} holds a sweep already ({len(jobs)} job(s): "
                    f"{', '.join(f'{n} {how}' for how, n in sorted(ends.items()))}): rerun it with "
                    "trainer.resume=auto to finish what is unfinished, set another hydra.sweep.dir, or remove "
                    f"{sweep_dir}")


class ForkServerAhead(Callback):
    """Hydra callback (conf/config.yaml): a sweep whose jobs run one after another in this process, with
    set-up before its first job (its MLflow parent run: 4 s of imports, report/sweep.py), gets their fork
    server started now, importing TensorFlow meanwhile, as the first job would start it (forkserver.shared),
    where the sweep's config makes its jobs one-process runs. A job that differs starts its own, as before."""

    def on_multirun_start(self, config, **kwargs) -> None:
        if not tracking.wanted(config) or runs_jobs_apart(config.hydra.launcher) or Topology.of(config).clustered \
                or schema.service_workers(config.data):
            return
        # (TensorFlow's import-time environment as the jobs' launches set it: the same server for them)
        forkserver.shared(RunDir(Path(config.hydra.sweep.dir)).log("forkserver"),
                          env=cpu.onednn_env(config.trainer.onednn))


_BEFORE = {}  # run directory: its files as this command found them (RunDir.snapshot), where it held a run


def found_before(run: RunDir) -> dict | None:
    """The run's files as this command found them, where it holds a run (what a refusal leaves); else None."""
    return _BEFORE.pop(run.path.resolve(), None) or (run.snapshot() if run.config.exists() else None)


def earlier_run(run: RunDir) -> str | None:
    """The run there, in words ("ended ok at global step 744"), or None if none was started there."""
    if not run.config.exists():
        return None
    status, found = run.ended(), run.read_results() or {}
    how = {"ok": "ended ok", "failed": "failed", "interrupted": "was interrupted", "restarting": "was restarting"}
    words = how.get(status, "was stopped before it recorded how it ended")
    if status == "ok" and "global_steps" in found:
        words += f" at global step {found['global_steps']}, {results.headline(found)}"
    latest = run.latest_checkpoint()
    return words + (f"; its latest checkpoint is {latest}" if latest and status != "ok" else "")


def _refuse(error: str):
    """Stop the command (a callback's exceptions are only warnings to Hydra)."""
    print_error(error)
    sys.exit(2)
