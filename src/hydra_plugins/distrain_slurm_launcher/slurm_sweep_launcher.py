"""Sweeps on Slurm (`-m hydra/launcher=slurm`): Hydra's submitit launcher, each job submitted with as
many Slurm tasks as its own cluster settings need, so a sweep over cluster.workers=1,2,4 asks Slurm
for 1, 2 and 4 workers' worth. Every task of a job runs `cluster=slurm`; rank 0 (the chief) reports.

It lives here because Hydra takes launchers from the hydra_plugins package only."""
import math
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides

from distrain.common import placement
from distrain.common.errors import ConfigError
from distrain.config.schema import CLUSTER_STRATEGIES, service_workers
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher, log


def job_tasks(cfg) -> int:
    """Slurm tasks one job needs: one per task of its cluster (cluster=slurm), else one."""
    if cfg.cluster.name != "slurm" or cfg.strategy.name not in CLUSTER_STRATEGIES:
        return 1
    return placement.slurm_tasks(cfg.cluster, cfg.strategy.name, service_workers(cfg.data))


class SlurmSweepLauncher(SlurmLauncher):
    def launch(self, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        """As submitit's Slurm launcher, but jobs are submitted one by one with their own task count
        (an array job would give every job the same), then awaited together."""
        import submitit

        executor = submitit.AutoExecutor(cluster="slurm", folder=self.params["submitit_folder"],
                                         slurm_max_num_timeout=self.params.get("max_num_timeout", 0))
        base = {k if k in _BASE_KEYS else f"slurm_{k}": v for k, v in self.params.items()
                if k not in ("submitit_folder", "max_num_timeout", "nodes", "tasks_per_node")}
        nodes = self.params.get("nodes") or 1
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info("Slurm sweep output dir: %s", sweep_dir)
        jobs = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            tasks = job_tasks(cfg)
            if tasks % nodes:
                raise ConfigError(f"job #{idx} needs {tasks} Slurm tasks, which do not divide over "
                                  f"hydra.launcher.nodes={nodes}: set hydra.launcher.nodes=1")
            executor.update_parameters(**base, nodes=nodes, tasks_per_node=math.ceil(tasks / nodes))
            log.info("\t#%d : %s (%d Slurm task(s))", idx, " ".join(filter_overrides(overrides)), tasks)
            jobs.append(executor.submit(self, list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}",
                                        Singleton.get_state()))
        return [job.results()[0] for job in jobs]  # rank 0: the chief's return


_BASE_KEYS = {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name",
              "stderr_to_stdout"}
