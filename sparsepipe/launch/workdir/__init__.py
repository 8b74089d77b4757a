"""A job's workdir: held by one job at a time (lock.py), whose job it is (owner.py), and
never a dataset, an export or inside saved work (location.py)."""
