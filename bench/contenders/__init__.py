"""The contenders. Each `run` function executes inside a worker process (bench.workers)
and returns what it did; the parent times it, checks it and turns it into rates."""
