"""Detecting damaged steps: array fingerprints, JSON digests, quarantine of corrupt steps."""
