"""The benchmark: tuned kernels against cuSPARSE on a suite, and its report; may import tuner.execute and below."""
