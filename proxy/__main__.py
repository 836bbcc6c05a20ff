"""`python -m proxy` is the same as the `oms-mpijob-proxy` command."""

import sys

from proxy.cli import main

sys.exit(main())
