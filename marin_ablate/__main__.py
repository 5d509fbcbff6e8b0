import sys

from marin_ablate.main import main

sys.exit(main())
