"""`hetlab train`: its config (config.py), the run's record (run.py), the loops that feed each
kind of algorithm (on_policy.py, off_policy.py) and the entry point that starts one (launch.py)."""
