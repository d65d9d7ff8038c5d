"""What the build reads and the installed package does not: the driver's table of
operations (``codegen.operations``), from which ``scripts/generate_client.py`` writes
``llm_db/_client_methods.py`` and ``scripts/reference.py`` writes docs/reference/.
The wheel ships ``llm_db/`` only, so none of this is installed."""
