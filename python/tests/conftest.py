"""pytest setup: the tests import golden.py from this directory."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Tests run two at a time with ctest's on a small machine: sleeping OpenMP workers.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
