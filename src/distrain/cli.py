"""`python train.py` / `distrain`: Hydra composes the config, the launcher runs it (no TensorFlow here)."""
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import launcher

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    code = launcher.launch(cfg, Path(HydraConfig.get().runtime.output_dir))
    if code:
        sys.exit(code)
