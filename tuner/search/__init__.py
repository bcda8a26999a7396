"""Tuning by measuring: the optuna loop, storages, shared studies, tune-many, sync; imports tuner.select and below."""
