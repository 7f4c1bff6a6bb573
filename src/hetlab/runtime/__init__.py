"""Moving data between devices and processes: shared memory, staging, weight broadcast, collectors."""

POLL_S = 0.1  # how often a waiting thread or process checks whether it should stop
