import sys

from commgnn.cli.main import main

sys.exit(main())
