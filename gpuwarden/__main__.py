"""``python -m gpuwarden`` runs the gpuwarden command."""

import sys

from gpuwarden.cli import main

sys.exit(main())
