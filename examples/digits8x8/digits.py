"""A loader for distrain: scikit-learn's 1,797 handwritten digits, 8x8 pixels of 17 grey levels (the
UCI optical-recognition set, shipped inside scikit-learn, so no download).

distrain calls `load(**the data node's other keys)` and wants keras.datasets' layout:
((x_train, y_train), (x_test, y_test)), images (N, H, W) or (N, H, W, C), integer labels.
"""
import numpy as np
from sklearn.datasets import load_digits


def load(test_fraction: float = 0.2, seed: int = 0):
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)  # float images are taken as they are: scale them here
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(len(images) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    return (images[train], digits.target[train]), (images[test], digits.target[test])
