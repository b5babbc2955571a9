"""`python train.py` / `distrain`: Hydra composes the config, the launcher runs it (no TensorFlow here).

`distrain summarize DIR` (re)builds the summary of a sweep directory.
"""
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from . import launcher, report, sweep

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")
INTERRUPTED = (130, 143)  # 128 + SIGINT, 128 + SIGTERM


class JobFailed(Exception):
    """One job of a sweep failed. It is returned, not raised: Hydra's sweepers end the sweep on a raised
    error, while a returned failure is a failed row of the summary (status.json says so) and, being no
    number, a failed trial for Optuna."""


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def run(cfg: DictConfig) -> float | JobFailed | None:
    """Runs one job; returns its test accuracy, the objective a Hydra sweeper such as Optuna optimises."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    job = None
    if hydra_cfg.mode == RunMode.MULTIRUN:
        job = launcher.Job(hydra_cfg.job.num, sweep.swept(hydra_cfg))
    code = launcher.launch(cfg, run_dir, job, overrides=hydra_cfg.overrides.task)
    if code in INTERRUPTED and job:
        print(f"sweep interrupted during job {job}: `distrain summarize {hydra_cfg.sweep.dir}` summarises "
              "the jobs so far", file=sys.stderr, flush=True)
    if code and (job is None or code in INTERRUPTED):
        sys.exit(code)  # a single run's status; an interrupt ends the whole sweep
    if code:
        return JobFailed(f"job {job} failed with exit status {code}")
    results = report.read_results(run_dir)
    return results["test_accuracy"] if results else None


def main() -> None:
    if sys.argv[1:2] == ["summarize"]:
        sys.exit(sweep.main(sys.argv[2:]))
    try:
        run()
    except KeyboardInterrupt:  # Ctrl-C outside a job (between the jobs of a sweep): no traceback
        print("interrupted: every process of the run stopped (a sweep: `distrain summarize SWEEP_DIR` "
              "summarises the jobs so far)", file=sys.stderr, flush=True)
        sys.exit(130)
