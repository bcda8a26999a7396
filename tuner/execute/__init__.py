"""Running y = A·x: plan(), the config it runs, SpMV and SpMSpV executors, BFS; may import tuner.search and below."""
