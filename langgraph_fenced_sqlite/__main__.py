"""`python -m langgraph_fenced_sqlite`: the `lgfs` command line (see `cli/main.py`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
