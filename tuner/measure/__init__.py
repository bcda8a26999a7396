"""Running and timing kernels on a device: backends, references, evaluation; may import tuner.matrix and below."""
