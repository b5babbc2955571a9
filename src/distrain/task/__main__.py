"""`python -m distrain.task CONFIG`: one task process (main.py), as the launcher starts it."""
from distrain.common.lifetime import exit_now, kept_for_good
from distrain.task.main import main

if __name__ == "__main__":  # (a task started by exec: one of a cluster spread over machines)
    with kept_for_good():  # what a fork server imports for the tasks it forks, and as it does
        from distrain.task import training  # noqa: F401 - imported here, kept for good
    exit_now(main())
