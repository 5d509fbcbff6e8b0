import sys

from marin_ablate.cli.main import main

sys.exit(main())
