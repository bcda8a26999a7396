"""Persistence: the SQLite store of matrices, devices, trials and best configs."""

from __future__ import annotations

from db.store import DEVICE_KINDS, ERROR_KINDS, TRIAL_STATES, Store, default_path

__all__ = ["DEVICE_KINDS", "ERROR_KINDS", "TRIAL_STATES", "Store", "default_path"]
