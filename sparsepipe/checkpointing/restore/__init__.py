"""The restore path: targets, reading and checking a step, re-layout, iterator states."""
