"""Where things are, for tests in any subfolder."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS)
GOLDEN = os.path.join(TESTS, "golden")
