"""``python -m awaken_langchain.demo``: one worker process of step d."""

from awaken_langchain.demo.worker import worker_main

raise SystemExit(worker_main())
