"""A job's workdir: held by one job at a time (lock.py), and whose job it is (owner.py)."""
