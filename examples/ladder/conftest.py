"""The levels import their shared host helpers (`ladder_common`) from their own directory, as a
script or a notebook run from here does."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
