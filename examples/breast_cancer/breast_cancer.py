"""A loader for distrain: scikit-learn's breast-cancer table (569 tumours, 30 measurements of each
cell sample; label 1: benign, 0: malignant), shipped inside scikit-learn, so no download.

distrain calls `load(**the data node's other keys)` and wants keras.datasets' layout:
((x_train, y_train), (x_test, y_test)); here float rows (N, 30) and 0/1 labels (N,).
"""
import numpy as np
from sklearn.datasets import load_breast_cancer


def load(test_fraction: float = 0.2, seed: int = 0):
    x, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(len(y) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    mean, std = x[train].mean(0), x[train].std(0)  # the measurements span 5 orders of magnitude
    x = ((x - mean) / std).astype(np.float32)
    return (x[train], y[train].astype(np.float32)), (x[test], y[test].astype(np.float32))
