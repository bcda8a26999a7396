"""The benchmark: tuned kernels against cuSPARSE on a suite, and its report; imports tuner.execute and below."""
