"""A loader for distrain: scikit-learn's diabetes table (442 patients, 10 measurements each, and a
measure of the disease's progression a year later), shipped inside scikit-learn, so no download.

distrain calls `load(**the data node's other keys)` and wants keras.datasets' layout:
((x_train, y_train), (x_test, y_test)); here float rows (N, 10) and float targets (N,).
"""
import numpy as np
from sklearn.datasets import load_diabetes


def load(test_fraction: float = 0.2, seed: int = 0):
    x, y = load_diabetes(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(len(y) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    # Standardised with the training rows' statistics: the target's spread (about 77) would otherwise
    # set the scale of the loss and of the learning rate.
    x_mean, x_std, y_mean, y_std = x[train].mean(0), x[train].std(0), y[train].mean(), y[train].std()
    x, y = ((x - x_mean) / x_std).astype(np.float32), ((y - y_mean) / y_std).astype(np.float32)
    return (x[train], y[train]), (x[test], y[test])
