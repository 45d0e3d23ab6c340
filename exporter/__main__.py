"""``python -m exporter`` runs the gpuwarden command."""

import sys

from exporter.cli import main

sys.exit(main())
