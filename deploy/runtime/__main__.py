"""`python -m deploy.runtime`: the edge runner (`vla-edge`)."""

import sys

from deploy.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
