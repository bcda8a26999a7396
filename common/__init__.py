"""The bottom floor, what every package may import: the project's exceptions. Imports nothing of the project."""
