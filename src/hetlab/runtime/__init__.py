"""Moving data between devices and processes: shared memory, staging, weight broadcast."""
