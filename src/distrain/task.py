"""One task process: read the run's resolved config, train, report. The launcher starts it."""
import sys
from pathlib import Path

from omegaconf import OmegaConf

from . import report
from .config import ConfigError


def main(argv=None) -> int:
    config_path = Path((argv or sys.argv[1:])[0])
    cfg = OmegaConf.load(config_path)
    run_dir = config_path.parent
    try:
        from .training import train  # TensorFlow starts here, in this process only

        results, _ = train(cfg, run_dir)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    report.write_results(run_dir, results)
    print(report.summary_line(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
