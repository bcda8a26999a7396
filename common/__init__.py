"""The bottom floor, what every package may import: the project's exceptions and NumPy's percentile in plain
Python; imports nothing of the project."""
