"""``python -m llm_db.cli``: the ``llm-db`` program, as ``python -m llm_db`` runs it
(one line naming the ``cli`` extra when click is missing)."""

from llm_db.__main__ import main

main()
