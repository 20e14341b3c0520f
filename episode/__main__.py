"""`python -m episode`: the command line of episode.cli."""
import sys

from episode.cli import main

sys.exit(main())
