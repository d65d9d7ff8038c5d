"""The subcommands of ``llm-db`` (``llm_db.cli.group`` assembles them), one module a theme:
``setup`` (migrate, distribute, schedule, unschedule), ``passes`` (reconcile,
health), ``notices`` (notices deliver / new-secret, worker), ``reports`` (report,
metrics) and ``demo``; ``common`` holds what they share. They need click (the
``cli`` extra): import ``llm_db.cli.group``, which says so when it is missing."""
