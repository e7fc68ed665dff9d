"""``python -m awaken_langchain``: the ``awaken-langchain`` command."""

from awaken_langchain.cli import main

raise SystemExit(main())
