"""The Optuna sweeper: asks the study for a trial as soon as one of its `n_jobs` slots frees (ask and
tell, no batches), runs it as one job of the sweep's launcher (trial N is job N), tells the study how
it ended (its objective, failed with its error line, or pruned), and at the end writes the best trial
to `optimization_results.yaml` and Optuna's own plots into the sweep directory.

The study lives in a storage the jobs' launchers open too (report/trial.py: a journal file in the sweep
directory unless hydra.sweeper.storage names one), where each reports its epochs to its trial and the
pruner (hydra.sweeper.pruner, any Optuna pruner by `_target_`) stops the trials it prunes.

Its keys are those of Hydra's Optuna sweeper 1.3 (direction, study_name, storage, n_trials, n_jobs,
max_failure_rate, sampler, params in Hydra's sweep syntax, custom_search_space), and pruner.

Hydra imports this module as every command starts, to find its plugins: Optuna (0.23 s of imports) is
imported where a study is run."""
import difflib
import inspect
import logging
import math
import os
import threading
import warnings
from pathlib import Path

from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep, Transformer
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

from distrain.common import private
from distrain.common.errors import ConfigError
from distrain.config import overrides, targets
from distrain.config.validate import check_objective, instantiate_as, validate
from distrain.report import sweep as sweep_lib
from distrain.report import trial as trial_lib

log = logging.getLogger(__name__)

# The launchers' own lines for each launch would number every trial #0 (one job per launch): the sweeper
# says which trial starts instead.
LAUNCHERS_LOGS = ("hydra._internal.core_plugins.basic_launcher", "hydra_plugins.hydra_joblib_launcher",
                  "hydra_plugins.hydra_submitit_launcher")
INTERRUPTED = "interrupted"  # a trial's user attribute: its job was interrupted, the next sweep goes on with it
PLOTS = {"optuna_history.png": "plot_optimization_history",
         "optuna_intermediate_values.png": "plot_intermediate_values",
         "optuna_importances.png": "plot_param_importances"}


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
    # (Its nodes come as config, _recursive_: false: the sampler is made here, the pruner in each job too.)
    def __init__(self, sampler=None, direction: str = "minimize", storage=None, study_name=None,
                 n_trials: int = 20, n_jobs=None, max_failure_rate: float = 0.0, params=None, pruner=None,
                 custom_search_space=None, split_cores: bool = True, **unknown) -> None:
        self.sampler, self.direction, self.storage, self.study_name = sampler, direction, storage, study_name
        self.n_trials, self.n_jobs, self.max_failure_rate = n_trials, n_jobs, max_failure_rate
        self.params, self.pruner, self.custom_search_space = params or {}, pruner, custom_search_space
        self.split_cores, self.unknown = split_cores, unknown  # (a key it does not have: said by sweep())

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context,
                                                                task_function=task_function)

    def sweep(self, arguments: list) -> None:
        sweep_dir = Path(self.config.hydra.sweep.dir)  # the sweep's whole config, as Hydra's basic sweeper keeps it
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        space, fixed = search_space([f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        for key in fixed:
            space.pop(key, None)
        slots = self._slots()
        extend = self._checked()
        study = self._study(sweep_dir)
        trials = Trials(self, study, space, fixed, extend)
        log.info("Study %s in %s: %s %s with %s, %s; %d trial(s) in all, %d at once; %d ended before%s",
                 study.study_name, trial_lib.where(self.storage, sweep_dir), self.direction,
                 self.config.trainer.objective, type(study.sampler).__name__,
                 f"pruned by {type(study.pruner).__name__}" if self.pruner else "no pruning", self.n_trials, slots,
                 trials.ended, f", {len(trials.left)} interrupted (resumed now)" if trials.left else "")
        if not (trials.to_ask or trials.left):
            log.warning("the study holds %d ended trials, hydra.sweeper.n_trials=%d: no more; raise it to add trials",
                        trials.ended, self.n_trials)
        if study.trials:  # a seeded sampler would ask for the first trials' values again
            study.sampler.reseed_rng()
        for name in LAUNCHERS_LOGS:
            logging.getLogger(name).setLevel(logging.WARNING)
        trials.run(slots)
        self._save_best(study, sweep_dir)
        draw_plots(study, sweep_dir)

    def _slots(self) -> int:
        """Trials at once (trial.at_once), which joblib's launcher then follows; each trial's share of this
        machine's cores said. Hydra's basic launcher runs one at a time."""
        pool = getattr(self.launcher, "joblib", None)  # (JoblibLauncher's keys)
        given = trial_lib.at_once(self.n_jobs, pool)
        if not isinstance(given, int) or given < 1:
            raise ConfigError(f"hydra.sweeper.n_jobs={given}: give the number of trials run at once, 1 or more")
        if given > 1 and isinstance(self.launcher, private.get("hydra_basic_launcher")):
            raise ConfigError(f"hydra.sweeper.n_jobs={given}: Hydra's basic launcher runs one job at a time, in "
                              "this process: add hydra/launcher=joblib to run trials side by side (or "
                              "hydra.sweeper.n_jobs=1)")
        if pool:
            pool["n_jobs"] = given
        launcher = self.config.hydra.get("launcher") or {}
        if given > 1 and sweep_lib.runs_jobs_apart(launcher):  # (on this machine)
            split, cores = trial_lib.share(given, launcher, self.split_cores), len(os.sched_getaffinity(0))
            log.info("%d trials at once on %d cores: %s", given, cores,
                     f"each pinned to {split} of them, TensorFlow's threads sized to its share" if split else
                     "they share every core" + (" (hydra.sweeper.split_cores=false)" if not self.split_cores else
                                                ": fewer cores than trials"))
        return given

    def _checked(self):
        """Bad input found before any trial (ConfigError): the direction, the trials, the objective (one
        every trial gives; of every epoch when pruning); the custom search space's function, returned."""
        for key in self.unknown:
            keys = [k for k in inspect.signature(OptunaSweeper).parameters if k != "unknown"]
            close = difflib.get_close_matches(key, keys, n=1)
            raise ConfigError(f"hydra.sweeper.{key} is not a key of the Optuna sweeper (it has {', '.join(keys)}): "
                              + (f"set hydra.sweeper.{close[0]} instead" if close else f"drop hydra.sweeper.{key}"))
        if self.direction not in ("minimize", "maximize"):
            raise ConfigError(f"hydra.sweeper.direction={self.direction}: set it to minimize or maximize")
        if not isinstance(self.n_trials, int) or self.n_trials < 1:
            raise ConfigError(f"hydra.sweeper.n_trials={self.n_trials}: give the number of trials, 1 or more")
        cfg = validate(OmegaConf.masked_copy(self.config, [k for k in self.config if k != "hydra"]))  # (a trial's)
        check_objective(cfg, per_epoch=bool(self.pruner))
        objective = cfg.trainer.objective
        if objective.startswith("test_") or (objective.startswith("val_") and not cfg.data.get("validation_split")):
            log.warning("trainer.objective=%s is measured on the test data%s: the search selects on it, so the best "
                        "trial's test figures overstate how it does on new data; tune on validation: "
                        "trainer.objective=val_%s with trainer.validate_every=1 data.validation_split=0.1 "
                        "(hparams_search=optuna's; arrays only)", objective,
                        "" if objective.startswith("test_") else " (no data.validation_split)",
                        objective.removeprefix("test_").removeprefix("val_"))
        if not self.custom_search_space:
            return None
        from hydra.utils import get_object

        try:
            return get_object(self.custom_search_space)
        except Exception as exc:  # noqa: BLE001 - a path that does not import is the user's input
            raise ConfigError(f"hydra.sweeper.custom_search_space={self.custom_search_space} cannot be imported "
                              f"({exc}): name a function (cfg, trial) -> None that suggests values") from None

    def _made(self, key: str, kind: str, wrong: str):
        """An Optuna sampler or pruner of the node at hydra.sweeper.KEY, its arguments checked first."""
        from hydra.utils import get_object

        node = getattr(self, key)
        if isinstance(node, get_object(kind)):  # (made already: a test's)
            return node
        if not OmegaConf.is_dict(node) or not node.get("_target_"):
            raise ConfigError(f"hydra.sweeper.{key}={node} is not a node with a _target_: give one, e.g. "
                              f"'hydra.sweeper.{key}={{_target_: optuna.pruners.MedianPruner, n_startup_trials: 2}}'")
        targets.check(f"hydra.sweeper.{key}", node._target_, {k: v for k, v in node.items() if k != "_target_"})
        return instantiate_as(f"hydra.sweeper.{key}", node, get_object(kind), f"fix hydra.sweeper.{key}", wrong)

    def _study(self, sweep_dir: Path):
        import optuna

        sampler = self._made("sampler", "optuna.samplers.BaseSampler", "an Optuna sampler") if self.sampler else None
        pruner = self._made("pruner", "optuna.pruners.BasePruner", "an Optuna pruner") if self.pruner else None
        try:
            return optuna.create_study(study_name=self.study_name or trial_lib.STUDY, sampler=sampler,
                                       pruner=pruner, storage=trial_lib.study_storage(self.storage, sweep_dir),
                                       direction=self.direction, load_if_exists=True)
        except ValueError as exc:  # another direction than the study kept there
            raise ConfigError(f"hydra.sweeper: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a storage that cannot be opened is the user's input
            raise ConfigError(f"hydra.sweeper.storage={self.storage} cannot be opened ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]}): give a database URL such as sqlite:///optuna.db, "
                              "or a journal file's path in a directory you can write") from None

    def _save_best(self, study, sweep_dir: Path) -> None:
        from optuna.trial import TrialState

        done = [t for t in study.trials if t.state == TrialState.COMPLETE]
        if not done:
            log.warning("No trial completed: no best trial")
            return
        best = study.best_trial
        log.info("Best value %s with %s (trial %d, %s)", best.value, best.params, best.number,
                 best.user_attrs.get("run_dir"))
        OmegaConf.save(OmegaConf.create({"name": "optuna", "best_params": best.params, "best_value": best.value,
                                         "best_trial": best.number, "best_run_dir": best.user_attrs.get("run_dir")}),
                       sweep_dir / "optimization_results.yaml")


class Trials:
    """The trials of one sweep, `slots` at once: each slot takes the next trial (first those an
    interrupted sweep left, resumed in their run directories; then new ones asked of the study), runs its
    job and tells how it ended, until the study holds n_trials that ended, the sweep is interrupted, or
    failures pass max_failure_rate. A trial interrupted (Ctrl-C) is left running in the study, marked
    so: the same command goes on with it from its checkpoint, and no trial counts twice."""

    def __init__(self, sweeper: OptunaSweeper, study, space: dict, fixed: dict, extend):
        self.sweeper, self.study, self.space, self.fixed, self.extend = sweeper, study, space, fixed, extend
        self.lock, self.told, self.failed, self.errors = threading.Lock(), 0, 0, []
        self.sweep_dir = Path(sweeper.config.hydra.sweep.dir)
        running = _states().RUNNING
        self.left = [t for t in study.trials if t.state == running and t.user_attrs.get(INTERRUPTED)]
        self.ended = sum(t.state.is_finished() for t in study.trials)
        self.to_ask = max(0, sweeper.n_trials - self.ended - len(self.left))

    def run(self, slots: int) -> None:
        if slots == 1:  # in this thread: Ctrl-C reaches the basic launcher's job here
            return self.slot()
        threads = [threading.Thread(target=self.slot, name=f"trial-slot-{i}", daemon=True) for i in range(slots)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.errors:
            raise self.errors[0]

    def _next(self):
        """The next trial and its job's overrides, or None: the sweep is done."""
        import optuna

        s = self.sweeper
        with self.lock:
            if self.told and self.failed / self.told > s.max_failure_rate and (self.to_ask or self.left):
                log.error("%d of %d trials failed, more than hydra.sweeper.max_failure_rate=%s: no more trials",
                          self.failed, self.told, s.max_failure_rate)
                self.to_ask, self.left = 0, []
            if self.errors or sweep_lib.stopped_by(self.sweep_dir) or not (self.to_ask or self.left):
                return None
            if self.left:  # (its id: Optuna's FrozenTrial keeps it as _trial_id)
                trial, again = optuna.trial.Trial(self.study, self.left.pop(0)._trial_id), {"trainer.resume": "auto"}
            else:
                self.to_ask -= 1
                trial, again = self.study.ask(self.space), {}
                if self.extend:
                    self.extend(s.config, trial)  # (Hydra's custom_search_space: it suggests more of its values)
            job = tuple(f"{k}={v}" for k, v in {**trial.params, **self.fixed, **again}.items())
            log.info("trial %d%s: %s", trial.number, " (interrupted before: again, from its checkpoint if it has one)"
                     if again else "", " ".join(f"{k}={v}" for k, v in trial.params.items()))
            return trial, job

    def slot(self) -> None:
        try:
            while (asked := self._next()) is not None:
                trial, job = asked
                try:
                    ret = self.sweeper.launcher.launch([job], initial_job_idx=trial.number)[0]
                except BaseException:  # Ctrl-C, or the sweep's own end: the study keeps the trial to go on with
                    with self.lock:
                        trial.set_user_attr(INTERRUPTED, True)
                    raise
                with self.lock:
                    self.tell(trial, ret)
        except BaseException as exc:  # noqa: BLE001 - raised again by run(), in the sweep's thread
            if threading.current_thread() is threading.main_thread():
                raise
            with self.lock:
                self.errors.append(exc)

    def tell(self, trial, ret) -> None:
        """Tell the study how the trial's job ended: its objective, pruned, or failed (why, in words); an
        interrupted one is left running, marked to go on with."""
        states = _states()
        if getattr(ret, "hydra_cfg", None):
            trial.set_user_attr("run_dir", str(ret.hydra_cfg.hydra.runtime.output_dir))
        try:
            value = ret.return_value  # (a job that raised raises here)
        except Exception as exc:  # noqa: BLE001 - any failure of a trial is the trial's, recorded as failed
            value = exc
        if isinstance(value, Exception) and sweep_lib.stopped_by(self.sweep_dir):
            trial.set_user_attr(INTERRUPTED, True)
            log.info("trial %d: interrupted; the same command goes on with it", trial.number)
            return
        self.told += 1
        if isinstance(value, trial_lib.Pruned):
            self.study.tell(trial, state=states.PRUNED)
            log.info("trial %d: %s", trial.number, value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            self.study.tell(trial, float(value))
            log.info("trial %d: %s %.6g", trial.number, self.sweeper.config.trainer.objective, value)
        else:
            self.failed += 1
            self.study.tell(trial, state=states.FAIL)
            log.warning("trial %d failed: %s", trial.number, value if isinstance(value, Exception) else
                        f"its job returned {value!r}, not a number")


def _states():
    from optuna.trial import TrialState

    return TrialState


def draw_plots(study, sweep_dir: Path) -> list:
    """Optuna's own plots of the study (its matplotlib visualisation), as PNG: the optimisation history,
    each trial's epochs, the parameters' importances; one Optuna cannot draw (too few trials) is said."""
    import optuna
    import optuna.visualization.matplotlib as drawing

    from distrain.report import plots  # (matplotlib, Agg: only once there is something to draw)

    drawn, verbosity = [], optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # (its warnings of too few trials: said below, once)
    for name, function in PLOTS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (ExperimentalWarning; too few trials for importances: said below)
            try:
                plots.save(getattr(drawing, function)(study).figure, sweep_dir / name, bbox_inches="tight")
                drawn.append(name)
            except Exception as exc:  # noqa: BLE001 - a plot that cannot be drawn never fails the search
                log.info("%s not drawn (%s)", name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    optuna.logging.set_verbosity(verbosity)
    return drawn
