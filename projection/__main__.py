import sys

from projection.cli import main

sys.exit(main())
