"""Tuning by measuring: the optuna loop, storages, study budgets, tune-many, sync; may import tuner.select and below."""
