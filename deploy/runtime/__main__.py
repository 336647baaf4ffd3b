"""`python -m deploy.runtime`: the edge runner (`vla-edge`); `python -m deploy.runtime client ...`: the thin
client of a policy server (`vla-client`)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        from deploy.runtime.client_cli import main

        sys.exit(main(sys.argv[2:]))
    from deploy.runtime.cli import main

    sys.exit(main())
