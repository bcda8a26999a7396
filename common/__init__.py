"""The bottom floor, what every package may import: the project's exceptions; imports nothing of the project."""
