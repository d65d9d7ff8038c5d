"""Shared test setup. The fixtures (llm_server, llm_template, llm_dsn, llm_conn,
llm_connect, llm_role_conn, llm_cron_dsn) come from the llm_db.testing plugin.

The plugin is also registered by the package's pytest11 entry point under the
same name, so pytest loads it once either way (and this line still loads it
when plugin autoloading is disabled)."""

pytest_plugins = ["llm_db.testing"]
