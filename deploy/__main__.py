import os

# Deployment facts that must exist before anything imports ray: bind a locally started Ray to
# loopback (Ray reads this at import time) and skip 2.60's token auth for local clusters.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from deploy.cli import main

if __name__ == "__main__":
    main()
