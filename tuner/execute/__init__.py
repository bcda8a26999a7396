"""Running y = A·x: plan(), the config it runs, the SpMV and SpMSpV executors, BFS; imports tuner.search and below."""
