"""``python -m alpa_comm.cli``: the same as the ``alpa-comm`` command."""
import sys

from . import main

sys.exit(main())
