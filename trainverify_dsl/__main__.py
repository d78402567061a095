import sys

from trainverify_dsl.cli.main import main

sys.exit(main())
