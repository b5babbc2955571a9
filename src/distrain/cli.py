"""`python train.py` / `distrain`: Hydra composes the config, the launcher runs it (no TensorFlow here).

`distrain summarize DIR` (re)builds the summary of a sweep directory; `distrain stacks RUN_DIR` shows
where each task of a running run is.
"""
import atexit
import contextlib
import difflib
import gc
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from distrain.common import private, storage
from distrain.common.errors import ConfigError, fail, print_error
from distrain.common.lifetime import exit_now
from distrain.common.messages import STARTED
from distrain.common.rundir import RunDir
from distrain.config import schema_check
from distrain.config.overrides import keys_of, split
from distrain.config.validate import validate

CONFIG_DIR = str(Path(__file__).resolve().parent / "conf")  # inside the package: an installed wheel has it
INTERRUPTED = (130, 143)  # 128 + SIGINT, 128 + SIGTERM


class JobFailed(Exception):
    """One job of a sweep failed. It is returned, not raised: Hydra's sweepers end the sweep on a raised
    error, while a returned failure is a failed row of the summary (status.json says so) and, being no
    number, a failed trial for Optuna."""


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def run(cfg: DictConfig):
    """Runs one job; returns trainer.objective of its results (test accuracy by default), which a Hydra
    sweeper such as Optuna optimises (a failed job: JobFailed; a trial its pruner stopped: trial.Pruned)."""
    from distrain.launcher import launch
    from distrain.report import sweep, trial  # here: --help and --cfg job need neither (numpy, ports: 0.25 s)
    from distrain.report.results import figure

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    job, apart = None, False
    if hydra_cfg.mode == RunMode.MULTIRUN:
        apart = sweep.runs_jobs_apart(hydra_cfg.launcher)
        job = sweep.Job(hydra_cfg.job.num, sweep.swept(hydra_cfg), Path(hydra_cfg.sweep.dir) if apart else None,
                        trial.Trial.of(hydra_cfg))
    code = launch_apart(cfg, run_dir, job, hydra_cfg) if apart else \
        launch.launch(cfg, run_dir, job, overrides=hydra_cfg.overrides.task)
    if code in INTERRUPTED and job and not apart:
        print(f"sweep interrupted during job {job}: `distrain summarize {hydra_cfg.sweep.dir}` summarises "
              "the jobs so far", file=sys.stderr, flush=True)
    if code and (job is None or (code in INTERRUPTED and not apart)):
        sys.exit(code)  # a single run's status; an interrupt ends the whole sweep (its process ends one apart)
    if code:
        how = "was interrupted" if code in INTERRUPTED else f"failed with exit status {code}"
        error = RunDir(run_dir).read_status().get("error")
        return JobFailed(f"job {job} {how}" + (f": {error}" if error else ""))
    if job and job.trial and job.trial.pruned:
        return trial.Pruned(job.trial.pruned_at, job.trial.pruned)
    results = RunDir(run_dir).read_results()
    if not results:
        return None
    objective = cfg.trainer.objective
    if (value := figure(results, objective)) is None:
        numbers = sorted(k for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        return JobFailed(f"job {job}: trainer.objective={objective} is not a figure of its results.json (it has "
                         f"{', '.join(numbers)}): set trainer.objective to one of them")
    return value


def launch_apart(cfg, run_dir: Path, job, hydra_cfg) -> int:
    """A sweep's job in a process of its own (sweep.runs_jobs_apart), which hears Ctrl-C for the sweep
    (the sweep's process ignores it): interrupted, it says so to the sweep, whose other jobs stop too.
    Between jobs, the process ignores Ctrl-C again (joblib's workers would die of it)."""
    from distrain.launcher import launch

    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = launch.launch(cfg, run_dir, job, overrides=hydra_cfg.overrides.task)
    except KeyboardInterrupt:  # before its tasks started
        RunDir(run_dir).write_status("interrupted", 130, "interrupted by SIGINT", job=job)
        job.say_stopped(signal.SIGINT)
        code = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


def _help(root: DictConfig) -> str:
    """`--help`: how to run, the groups and their options (the user's own marked), and every key with its
    value, type and meaning."""
    options = {}
    for base, mark in [(Path(CONFIG_DIR), ""), *((Path(d), " (yours)") for d in _users_dirs())]:
        for path in sorted(base.glob("*/**/*.yaml")):  # hydra/launcher too
            options.setdefault(str(path.parent.relative_to(base)), {}).setdefault(path.stem, mark)
    groups = "\n".join(f"  {group}: {', '.join(o + mark for o, mark in sorted(found.items()))}"
                       for group, found in sorted(options.items()))
    keys = schema_check.describe(root)
    return f"""distrain: config-driven distributed training for TensorFlow.

  distrain [group=option ...] [key=value ...]     one run, e.g. strategy=mirrored
  distrain -m key=a,b ...                         a sweep: one run per value, then a summary
  distrain summarize SWEEP_DIR                    (re)build a sweep's summary
  distrain stacks RUN_DIR                         each task's Python stacks and step, in a running run
  distrain log RUN_OR_SWEEP_DIR...                finished runs and sweeps into MLflow (logger.mlflow.KEY=...)
  distrain evaluate RUN_DIR [overrides]           a run's model on its test data, or on the data named
  distrain predict RUN_DIR [overrides] out=F.npz  its outputs for every example, in order (.csv, .tfrecord)
                                                  (both: several RUN_DIRs or -m key=a,b, then a table;
                                                  strategy=multi_worker_mirrored cluster.workers=N: on N)
  (In a checkout, `python train.py` is the same as `distrain`.)

== Groups (group=option) ==
{groups}

== Keys (key=value): the value with these choices, its type, what it means ==
{keys}

Hydra's own options: --hydra-help. The resolved config of these choices: --cfg job.
"""


# --help is drawn from the composed config, so it shows the values of the choices on the command line.
# Hydra's template language reads "$": escape it.
OmegaConf.register_new_resolver("distrain.help", lambda _root_: _help(_root_).replace("$", "$$"), replace=True)


def _run_dir(cluster: str, default: str) -> str:
    """The run directory: the tasks of one Slurm job step share one, named by the job and step (a
    requeued job finds its own again); else the clock names it."""
    if cluster == "slurm" and "SLURM_JOB_ID" in os.environ:
        return f"outputs/slurm/{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '0')}"
    return default


OmegaConf.register_new_resolver("distrain.run_dir", _run_dir, replace=True)


def _error_line(exc: Exception) -> str:
    """One line for an error of Hydra or OmegaConf while composing the config; a key an option's file
    gets wrong names that file."""
    cause = next((c for c in (exc.__cause__, exc.__context__) if isinstance(c, OmegaConfBaseException)), exc)
    if isinstance(cause, OmegaConfBaseException):
        option = re.match(r"In '([^']+)': ", str(exc)) if isinstance(exc, ConfigCompositionException) else None
        if option:
            files = [d / f"{option.group(1)}.yaml" for d in (*map(Path, _users_dirs()), Path(CONFIG_DIR))]
            return f"in {next((f for f in files if f.exists()), option.group(1))}: {schema_check.explain(cause)}"
        return schema_check.explain(cause)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, MissingConfigException) and len(lines) > 2 and lines[1].startswith("Available options"):
        group, wanted = lines[1].split("'")[1], lines[0].split("'")[-2].rsplit("/", 1)[-1]
        return _not_an_option(group, wanted, [line for line in lines[2:] if "=" not in line and not line.endswith(":")])
    missing = re.search(r"Could not load '([\w/]+)/([^'/]+)'", str(exc))  # (an option of a list: logger=[a,b])
    if missing:
        group, wanted = missing.groups()
        return _not_an_option(group, wanted, sorted({path.stem for base in (Path(CONFIG_DIR), *map(Path, _users_dirs()))
                                                     for path in (base / group).glob("*.yaml")}))
    if isinstance(exc, OverrideParseException):
        return f"cannot read the override {exc.override!r} ({lines[0]}): write key=value, and quote a value " \
               "with brackets or spaces, e.g. 'strategy.devices=[/cpu:0,/cpu:1]'"
    return "; ".join(lines)


def _not_an_option(group: str, wanted: str, options: list) -> str:
    close = difflib.get_close_matches(wanted, options, n=1, cutoff=0.5) or options[:1]
    return f"{group}={wanted} is not an option of {group} ({', '.join(options)}): set e.g. {group}={close[0]}"


# Options of Hydra's command line that take a value (`--cfg job`).
VALUED_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                "--config-dir", "-cd", "--experimental-rerun"}
INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def _flags_first(argv: list) -> tuple[list, list]:
    """Hydra's options, and the overrides: `strategy=mirrored --cfg job trainer.epochs=3` means what
    `--cfg job strategy=mirrored trainer.epochs=3` means (argparse takes overrides only in one run)."""
    flags, overrides, rest = [], [], list(argv)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-") or arg == "-":
            overrides.append(arg)
            continue
        flags.append(arg)
        takes = arg in VALUED_FLAGS or (arg in ("--info", "-i") and rest and rest[0] in INFO_TOPICS)
        if takes and rest:
            flags.append(rest.pop(0))
    return flags, overrides


def _own_dirs(flags: list, overrides: list) -> list:
    """The user's config directories: --config-dir's, and hydra.searchpath's file:// entries."""
    own = [flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag in ("--config-dir", "-cd")][-1:]
    for override in overrides:
        if override.startswith("hydra.searchpath="):
            own += re.findall(r"file://([^,\]\s'\"]+)", override)
    return [os.path.abspath(d) for d in own]


def groups_setting_mode(dirs: list) -> set | None:
    """The config groups one of whose options sets hydra.mode (a preset that makes its command a sweep:
    experiment=strategies), or selects (in its defaults list) an option of such a group; None where a primary
    config of the user's may set it. A file that cannot be read counts as one that does."""
    import yaml

    refers, setting = {}, set()
    for base in map(Path, dirs):
        if base != Path(CONFIG_DIR) and (base / "config.yaml").exists():
            return None
        for path in base.glob("*/**/*.yaml"):
            group = str(path.parent.relative_to(base))
            try:
                content = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
                hydra_node = content.get("hydra") or {}
                defaults = content.get("defaults") or []
                if "mode" in hydra_node or "hydra.mode" in content:
                    setting.add(group)
            except (OSError, yaml.YAMLError, AttributeError, TypeError):
                setting.add(group)
                continue
            for entry in defaults:
                refers.setdefault(_selected_group(entry, group), set()).add(group)
    grown = set(setting)
    while grown:
        grown = set().union(*(refers.get(group, set()) for group in grown)) - setting
        setting |= grown
    return setting


def _selected_group(entry, group: str) -> str:
    """The group an entry of a defaults list in an option of `group` selects from, as Hydra reads it: an
    absolute path from the top (`/study: lrs`, `override /hydra/sweeper: optuna`, `/schema/model/mlp@_here_`),
    a relative one from the option's own group (`db: mysql` is `group/db`; `mlp` is `group`)."""
    path = next(iter(entry)).split()[-1] if isinstance(entry, dict) else str(entry).rpartition("/")[0]
    path = path.split("@")[0]
    return path.strip("/") if path.startswith("/") else "/".join(filter(None, (group, path)))


@contextlib.contextmanager
def _mode_from_presets_only(overrides: list, dirs: list):
    """Hydra composes the whole config once before a command's run, only to read hydra.mode (a third of a
    short command's start-up: 0.19 s against 0.36-0.48 s of CPU for bad input, measured): skipped, and the
    mode left to the command line (-m), where no override can bring in an option that sets it."""
    keys = keys_of(overrides)
    setting = groups_setting_mode([CONFIG_DIR, *dirs])
    if setting is None or any(k.startswith(("hydra.mode", "hydra.searchpath")) or k in setting for k in keys):
        yield
        return
    hydra_class = private.get("hydra_class")
    composed = hydra_class.get_mode
    hydra_class.get_mode = lambda self, config_name, overrides: None  # (what it returns where none sets it)
    try:
        yield
    finally:
        hydra_class.get_mode = composed


def _users_dirs() -> list:
    """The user's config directories of this command (its options first: main() puts them so)."""
    return _own_dirs(*_flags_first(sys.argv[1:]))


def _compose(flags: list, overrides: list) -> DictConfig:
    """The config as Hydra composes it for a run, with the user's own --config-dir searched as Hydra's
    --config-dir is (after the package's: its options add to the groups)."""
    own = _own_dirs(flags, [])  # (hydra.searchpath overrides are among the overrides already)
    if own:
        overrides = [f"hydra.searchpath=[file://{own[0]}]", *overrides]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _quick_help(flags: list, overrides: list) -> bool:
    """`--help` answered here, from the composed config: Hydra's own --help lists every config group,
    which copies the config store once per group (about 0.7 s with the schema's groups)."""
    if not {"--help", "-h"} & set(flags) or {"-m", "--multirun"} & set(flags):  # a sweep's a,b: Hydra's way
        return False
    print(_help(_compose(flags, overrides)))
    return True


def _printed_config(flags: list, overrides: list) -> bool:
    """`--cfg job` prints the config instead of running it: it is checked as a run would check it, so
    that a value a run refuses is not shown as if it were fine. (Not for sweeps: a,b is no value.)
    `--cfg job` itself is answered here, from one composition (Hydra composes twice more); `--cfg all`
    and `--package` go on to Hydra."""
    shown = {flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag in ("--cfg", "-c")}
    if not shown & {"job", "all"} or {"-m", "--multirun"} & set(flags):
        return False
    cfg = _compose(flags, overrides)
    validate(cfg)
    if shown != {"job"} or {"-p", "--package"} & set(flags):
        return False
    print(OmegaConf.to_yaml(cfg, resolve="--resolve" in flags), end="")
    return True


def _tool(command: str, run_dirs: list, flags: list, overrides: list) -> int:
    """A command of its own (write-tfrecords, evaluate, predict): it takes the config directories and
    the overrides a run takes (-m: a,b values make a job each)."""
    asks_help = bool({"-h", "--help"} & set(flags))
    if command in ("evaluate", "predict"):  # the trained model
        from distrain.inference import commands

        return commands.main(command, run_dirs + overrides, lambda o: _compose(flags, o), help=asks_help,
                              multirun=bool({"-m", "--multirun"} & set(flags)))
    from distrain.data import write_tfrecords

    return write_tfrecords.main(overrides, lambda o: _compose(flags, o), help=asks_help)


TOOLS = ["evaluate", "predict", "write-tfrecords"]  # (the commands that take a run's config: _tool)
COMMANDS = sorted([*TOOLS, "log", "stacks", "summarize"])


def _not_an_override(overrides: list) -> str:
    """What a bare word among the overrides meant, where it is a command's name or close to one
    (`distrain evalute RUN_DIR`); Hydra would only say it cannot read it."""
    for word in overrides:
        if word in COMMANDS:
            return f"{word} is a command of distrain, not an override: give it first, e.g. distrain {word} ..."
        bare = re.fullmatch(r"[A-Za-z][\w-]*", word)  # (an override has "=", or starts with ~)
        close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6) if bare else []
        if close:
            return f"{word} is neither a command of distrain ({', '.join(COMMANDS)}) nor an override (key=value): " \
                   f"write distrain {close[0]} ..."
    return ""


def _command() -> tuple[str | None, list]:
    """A command of its own (write-tfrecords, evaluate, predict), and the run directories evaluate and
    predict take (several: a sweep's, multirun/DATE/TIME/*), taken off sys.argv."""
    command = sys.argv.pop(1) if sys.argv[1:2] and sys.argv[1] in TOOLS else None
    run_dirs = []
    while command in ("evaluate", "predict") and sys.argv[1:2] and not sys.argv[1].startswith("-") and \
            "=" not in sys.argv[1]:
        run_dirs.append(sys.argv.pop(1))
    return command, run_dirs


def _unwritten(exc: OSError, command: str | None, overrides: list) -> str:
    """The line of what a command could not write: a full disk, a run directory, a command's own file."""
    if storage.is_full(exc):
        named = [split(o)[1] for o in overrides if o.startswith(("hydra.run.dir=", "hydra.sweep.dir="))]
        where = exc.filename or (named or ["."])[-1]  # (Hydra's own writes name no file)
        return storage.full_disk_line(Path(os.path.abspath(where)), None, started=False)
    if command:  # (evaluate, predict, write-tfrecords: their own files)
        return f"{exc.filename or 'a file'} cannot be written ({exc.strerror}): check that you can write there"
    return (f"the run directory cannot be created or written ({exc.strerror}: {exc.filename}): set hydra.run.dir "
            "(hydra.sweep.dir for sweeps) to a directory you can write")


def _quick_teardown() -> None:
    """At the process's end, every object out of the collector's sight: the interpreter's teardown then
    frees them without its collections passing over them all (0.25 s a run; 0.7-1.1 s with MLflow's
    modules). Registered once, however often a script or test calls main()."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def main() -> None:
    os.environ.setdefault(STARTED, str(time.time()))  # for results.json's seconds_to_first_step
    _quick_teardown()
    if os.getcwd() not in sys.path:  # a user's model or data module, as the tasks (python -m) import it
        sys.path.insert(1, os.getcwd())
    if sys.argv[1:2] == ["summarize"]:
        from distrain.report import sweep

        sys.exit(sweep.main(sys.argv[2:]))
    if sys.argv[1:2] == ["log"]:
        from distrain.report import log_after

        sys.exit(log_after.main(sys.argv[2:]))
    if sys.argv[1:2] == ["stacks"]:
        from distrain.launcher import stalls

        sys.exit(stalls.main(sys.argv[2:]))
    # Hydra raises its errors to us instead of printing them, so that each is one line; a user who sets
    # HYDRA_FULL_ERROR=1 gets the traceback instead.
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    logging.raiseExceptions = False  # a log file that cannot be written (a full disk): no traceback per line
    os.environ["HYDRA_FULL_ERROR"] = "1"
    command, run_dirs = _command()
    flags, overrides = _flags_first(sys.argv[1:])
    sys.argv[1:] = flags + overrides
    try:
        if meant := _not_an_override(overrides):
            raise ConfigError(meant)
        if command:
            had_tensorflow = "tensorflow" in sys.modules
            code = _tool(command, run_dirs, flags, overrides)
            if "tensorflow" in sys.modules and not had_tensorflow:  # (all is written: its shutdown takes a second)
                exit_now(code)
            sys.exit(code)
        if not (_quick_help(flags, overrides) or _printed_config(flags, overrides)):
            with _mode_from_presets_only(overrides, _own_dirs(flags, overrides)):
                run()
    except ConfigError as exc:
        sys.exit(fail(exc))
    except (HydraException, OmegaConfBaseException) as exc:
        if full_error:
            raise
        print_error(_error_line(exc))
        sys.exit(2)
    except BrokenPipeError:  # the reader of the output went (`distrain --help | head`): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's advice: no second error)
        sys.exit(128 + signal.SIGPIPE)
    except OSError as exc:  # Hydra could not create the run directory, or we could not write in it
        if full_error:
            raise
        print_error(_unwritten(exc, command, overrides))
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C outside a job (between the jobs of a sweep, or joblib's): no traceback
        sweep = sys.modules.get("distrain.report.sweep")  # a sweep under way imported it
        if sweep:
            sweep.mark_interrupted(sweep.SweepSummary.sweep_dir, "interrupted by SIGINT")
        print("interrupted: every process of the run stopped (a sweep: `distrain summarize SWEEP_DIR` "
              "summarises the jobs so far)", file=sys.stderr, flush=True)
        sys.exit(130)
