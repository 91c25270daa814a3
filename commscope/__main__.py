"""``python -m commscope`` is the ``commscope`` command."""

from commscope.cli import main

raise SystemExit(main())
