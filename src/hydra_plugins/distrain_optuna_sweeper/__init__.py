"""Hyperparameter search with Optuna (`hparams_search=optuna`, or `hydra/sweeper=optuna`): a Hydra sweeper
on a current Optuna, whose database storage runs on the SQLAlchemy 2 that MLflow's store needs too.

It lives here because Hydra takes sweepers from the hydra_plugins package only. It runs in the sweep's
process (no TensorFlow); each trial is one job of the sweep's launcher."""
