import sys

from seqlm.cli import main

sys.exit(main())
