"""Running and timing kernels on a device: backends, references, one config measured; imports tuner.matrix and below."""
