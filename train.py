"""Train the MNIST model under the tf.distribute strategy the config names.

    python train.py strategy=mirrored strategy.cpu_virtual_devices=2
"""
from distrain.cli import main

if __name__ == "__main__":
    main()
