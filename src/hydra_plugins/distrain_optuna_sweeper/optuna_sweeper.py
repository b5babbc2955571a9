"""The Optuna sweeper: asks the study for a batch of trials, runs them as one batch of jobs of the sweep's
launcher, tells the study each job's objective (a job that returns no number is a failed trial), and
writes the best trial to `optimization_results.yaml` in the sweep directory.

Its keys are those of Hydra's Optuna sweeper 1.3 (direction, study_name, storage, n_trials, n_jobs,
max_failure_rate, sampler, params in Hydra's sweep syntax), so its configs carry over.

Hydra imports this module as every command starts, to find its plugins: Optuna (0.23 s of imports) is
imported where a study is run."""
import logging
import math
from pathlib import Path

from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep, Transformer
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

from distrain.config import overrides

log = logging.getLogger(__name__)


def distribution(override):
    """The Optuna distribution of one sweep override (`choice(64, 128)`, `range(1, 5)`,
    `interval(0.1, 1)`, `tag(log, interval(1e-4, 1e-2))`), or None for a fixed value."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value = override.value()
    if isinstance(value, ChoiceSweep) or (isinstance(value, RangeSweep) and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    if isinstance(value, RangeSweep):  # [start, stop) as Hydra's range: stop is not a value
        if all(isinstance(v, int) for v in (value.start, value.stop, value.step)):
            last = value.start + (math.ceil((value.stop - value.start) / value.step) - 1) * value.step
            return IntDistribution(value.start, last, step=value.step)
        count = math.ceil((value.stop - value.start) / value.step)
        return FloatDistribution(value.start, value.start + (count - 1) * value.step, step=value.step)
    if isinstance(value, IntervalSweep):
        ints = isinstance(value.start, int) and isinstance(value.end, int)
        kind = IntDistribution if ints else FloatDistribution
        return kind(value.start, value.end, log="log" in value.tags)
    return None


def search_space(arguments: list) -> tuple[dict, dict]:
    """{key: distribution} of the swept keys and {key: value} of the fixed ones."""
    space, fixed = {}, {}
    for override in overrides.parse(arguments):
        found = distribution(override) if override.is_sweep_override() else None
        if found is None:
            fixed[override.get_key_element()] = override.get_value_element_as_str()
        else:
            space[override.get_key_element()] = found
    return space, fixed


class OptunaSweeper(Sweeper):
    def __init__(self, sampler=None, direction: str = "minimize", storage=None, study_name=None,
                 n_trials: int = 20, n_jobs: int = 2, max_failure_rate: float = 0.0, params=None) -> None:
        if direction not in ("minimize", "maximize"):
            raise ValueError(f"hydra.sweeper.direction={direction}: set it to minimize or maximize")
        self.sampler, self.direction, self.storage, self.study_name = sampler, direction, storage, study_name
        self.n_trials, self.n_jobs, self.max_failure_rate = n_trials, max(1, n_jobs), max_failure_rate
        self.params = params or {}

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context,
                                                                task_function=task_function)

    def sweep(self, arguments: list) -> None:
        import optuna
        from optuna.trial import TrialState

        sweep_dir = Path(self.config.hydra.sweep.dir)  # the sweep's whole config, as Hydra's basic sweeper keeps it
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        space, fixed = search_space([f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        for key in fixed:
            space.pop(key, None)
        study = optuna.create_study(study_name=self.study_name, storage=self.storage, sampler=self.sampler,
                                    direction=self.direction, load_if_exists=True)
        log.info("Study %s (%s), sampler %s, %s; %d trials of %d before", study.study_name,
                 self.storage or "in memory", type(study.sampler).__name__, self.direction, self.n_trials,
                 len(study.trials))
        if study.trials:  # a seeded sampler would ask for the first trials' values again
            study.sampler.reseed_rng()
        to_go = self.n_trials
        while to_go > 0:
            trials = [study.ask(space) for _ in range(min(to_go, self.n_jobs))]
            overrides = [tuple(f"{k}={v}" for k, v in {**t.params, **fixed}.items()) for t in trials]
            # A job's number is its trial's: a resumed study's jobs do not overwrite the earlier ones'.
            returns = self.launcher.launch(overrides, initial_job_idx=trials[0].number)
            failed = 0
            for trial, ret in zip(trials, returns):
                value = self._objective(ret)
                if value is None:
                    failed += 1
                    study.tell(trial, state=TrialState.FAIL)
                else:
                    study.tell(trial, value)
            if failed / len(returns) > self.max_failure_rate:
                raise RuntimeError(f"{failed} of {len(returns)} trials failed, more than "
                                   f"hydra.sweeper.max_failure_rate={self.max_failure_rate}")
            to_go -= len(trials)
        self._save_best(study)

    @staticmethod
    def _objective(ret) -> float | None:
        """The job's number, or None (a failed job, or one that returned no number)."""
        try:
            value = float(ret.return_value)  # a job that raised raises here
        except Exception as exc:  # noqa: BLE001 - any failure of a trial is the trial's, recorded as failed
            log.warning("Failed trial: %s", exc)
            return None
        return None if math.isnan(value) else value

    def _save_best(self, study) -> None:
        from optuna.trial import TrialState

        done = [t for t in study.trials if t.state == TrialState.COMPLETE]
        if not done:
            log.warning("No trial completed: no best trial")
            return
        best = study.best_trial
        log.info("Best value %s with %s", best.value, best.params)
        OmegaConf.save(OmegaConf.create({"name": "optuna", "best_params": best.params, "best_value": best.value}),
                       f"{self.config.hydra.sweep.dir}/optimization_results.yaml")
