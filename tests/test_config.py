"""The real conf/ composes in every combination a user can name, and bad values fail fast."""
import pytest

from distrain.common.errors import ConfigError
from distrain.config.validate import validate

from helpers import CONF, make_cfg


def options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_defaults_are_the_documented_ones():
    cfg = make_cfg()
    assert (cfg.strategy.name, cfg.model.name, cfg.data.name) == ("default", "cnn", "mnist")
    assert cfg.data.source == "auto"
    validate(cfg)


@pytest.mark.parametrize("group", ["strategy", "model", "data", "trainer", "cluster"])
def test_every_option_composes_and_validates(group):
    assert options(group), f"conf/{group} is empty"
    for option in options(group):
        cfg = make_cfg(f"{group}={option}")
        assert cfg[group].get("name", option) == option
        if option != "fashion_mnist":  # its data path need not exist for validation
            validate(make_cfg(f"{group}={option}", *(["data.path=x.npz"] if option == "npz" else [])))


def test_strategy_group_has_the_contracted_names():
    assert set(options("strategy")) == {"default", "one_device", "mirrored", "central_storage",
                                        "multi_worker_mirrored", "parameter_server"}
    assert set(options("cluster")) == {"local", "tf_config", "manual", "slurm"}
    assert set(options("model")) == {"cnn", "mlp"}
    assert set(options("data")) == {"mnist", "fashion_mnist", "synthetic", "npz", "tfrecord", "images"}


@pytest.mark.parametrize("overrides, message", [
    (["trainer.epochs=0"], "trainer.epochs=0 must be a positive integer"),
    (["trainer.batch_size=-8"], "trainer.batch_size=-8 must be a positive integer"),
    (["trainer.steps_per_execution=0"], "trainer.steps_per_execution=0"),
    (["trainer.learning_rate=-1"], "trainer.learning_rate=-1.0 must be a finite positive number"),
    (["data.source=idx"], "data.source=idx needs data.path"),
    (["strategy=mirrored", "strategy.cpu_virtual_devices=3"],
     "trainer.batch_size=128 is the global batch and must divide evenly over 3 replicas: "
     "set trainer.batch_size=126 or 129"),
    (["strategy=mirrored", "strategy.devices=[/cpu:0,/cpu:1,/cpu:2]", "trainer.batch_size=100"],
     "over 3 replicas"),
    (["strategy=mirrored", "strategy.cpu_virtual_devices=-1"], "strategy.cpu_virtual_devices=-1"),
    (["strategy=mirrored", "strategy.devices=[]"], "strategy.devices=[] names no device"),
    (["+trainer.epoch=1"], "trainer.epoch is not a key of trainer: set e.g. trainer.epochs=12"),
    (["data.service.workers=-1"], "data.service.workers=-1 must be 0 or more: set e.g. data.service.workers=2"),
    (["data.service.sharding=dyn"], "data.service.sharding=dyn is not one of dynamic, off"),
    (["data.service.address=host"], "data.service.address=host must be grpc://host:port"),
    (["data.service.workers=2", "data.service.address=h:1"], "data.service.workers=2 starts a service and "
     "data.service.address names one that runs: set one of them"),
    (["data.service.workers=2", "cluster=tf_config"], "data.service.workers=2 starts the service's tasks on this "
     "machine (cluster=local); with cluster=tf_config, list dispatcher and data_worker tasks in the cluster, or "
     "start them: set data.service.address=grpc://host:port (docs/data_in_files.md)"),
    (["strategy=parameter_server", "trainer.jit_compile=true"], "XLA cannot compile a step whose variables live "
     "on ps tasks"),
    (["strategy=mirrored", "strategy.cpu_virtual_devices=2", "trainer.jit_compile=true"],
     "trainer.jit_compile=true cannot work on several CPU devices under strategy=mirrored"),
    (["strategy=central_storage", "strategy.devices=[/cpu:0,/cpu:1]", "trainer.jit_compile=true"],
     "trainer.jit_compile=true cannot work on several CPU devices under strategy=central_storage"),
])
def test_bad_values_name_the_problem_and_the_fix(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(make_cfg(*overrides))
    text = str(err.value)
    assert message in text
    assert "\n" not in text  # one line
    assert ": set " in text  # ...that ends with the fix


def test_batch_that_divides_over_replicas_passes():
    validate(make_cfg("strategy=mirrored", "strategy.cpu_virtual_devices=4", "trainer.batch_size=128"))


def test_old_steps_per_schedule_still_works_with_one_notice(capsys):
    """strategy.steps_per_schedule was the parameter-server spelling of trainer.steps_per_execution."""
    import distrain.config.validate

    distrain.config.validate._told.clear()
    cfg = validate(make_cfg("strategy=parameter_server", "strategy.steps_per_schedule=7"))
    assert cfg.trainer.steps_per_execution == 7
    assert cfg.strategy.steps_per_schedule is None  # one key in the recorded config
    validate(make_cfg("strategy=parameter_server", "strategy.steps_per_schedule=7"))
    notices = capsys.readouterr().err.splitlines()
    assert notices == ["warning: strategy.steps_per_schedule is deprecated: write trainer.steps_per_execution=7 "
                       "instead (it means the same)"]  # once, however often the config is checked
    # control: without the old key, the new one is left alone
    assert validate(make_cfg("strategy=parameter_server",
                             "trainer.steps_per_execution=3")).trainer.steps_per_execution == 3




def test_a_run_made_before_the_builders_moved_names_them_as_they_are_now():
    """A run's config.yaml from before the built-in builders moved to distrain.task.model still validates
    (evaluate, predict and resume read it); the control: any other name is left as it is."""
    cfg = make_cfg()
    cfg.model._target_ = "distrain.model.cnn"
    assert validate(cfg).model._target_ == "distrain.task.model.cnn"
    cfg.model._target_ = "distrain.model.nosuch"
    assert validate(cfg).model._target_ == "distrain.model.nosuch"


def test_a_resume_may_change_the_workers_and_replicas_and_nothing_else_of_the_run(tmp_path):
    """trainer.resume=true takes the run's config; cluster.workers, strategy.devices and
    strategy.cpu_virtual_devices may change with it (a resume at another size), the batch may not."""
    from omegaconf import OmegaConf

    from distrain.config.validate import resumed

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-32"\n')
    OmegaConf.save(make_cfg("strategy=multi_worker_mirrored", "cluster.workers=2"), run / "config.yaml")
    overrides = ["trainer.resume=true", "cluster.workers=1", "trainer.epochs=20"]
    cfg = resumed(make_cfg("strategy=multi_worker_mirrored", *overrides), run, overrides)
    assert (cfg.cluster.workers, cfg.trainer.epochs, cfg.trainer.resume) == (1, 20, True)
    with pytest.raises(ConfigError, match="trainer.batch_size=64 contradicts the run being resumed"):
        resumed(make_cfg("strategy=multi_worker_mirrored", "trainer.batch_size=64"), run, ["trainer.batch_size=64"])


def test_overrides_are_read_as_hydra_reads_them():
    """config/overrides.py: the key of an added or deleted key, Hydra's escapes undone, a sweep's jobs."""
    from distrain.config import overrides

    assert overrides.keys_of(["+trainer.foo=1", "~logger", "model=mlp", "hydra/launcher=joblib"]) == [
        "trainer.foo", "logger", "model", "hydra/launcher"]
    assert overrides.split("strategy.device=/gpu\\:7") == ("strategy.device", "/gpu:7")
    assert overrides.split("not an override=[") == ("not an override", "[")  # (a label: as it is)
    jobs, varied = overrides.combinations(["cluster.workers=1,2", "model=mlp", "trainer.epochs=1,3"])
    assert varied == ["cluster.workers", "trainer.epochs"] and len(jobs) == 4
    assert jobs[1] == ["cluster.workers=1", "model=mlp", "trainer.epochs=3"]
    assert overrides.swept_keys(["a=1,2", "b=3"]) == {"a"} and overrides.swept_keys(["a=[,"]) == set()
