"""Matrices: reading, generating and describing them, suites, source lists; may import common, kernels, db."""
