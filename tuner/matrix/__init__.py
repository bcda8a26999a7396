"""Matrices: reading, generating, describing them, suites and source lists; imports common and kernels only."""
