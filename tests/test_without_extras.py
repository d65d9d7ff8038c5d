"""``import llm_db`` and the driver work without the ``worker`` extra (issue #13): httpx,
standardwebhooks and prometheus_client are imported only by what needs them, and the
commands that need them exit 2 with one line naming ``pip install 'llm-db[worker]'``.

Each check runs in a fresh interpreter whose ``sys.meta_path`` refuses those modules, as
if they were not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BLOCKED = ("httpx", "standardwebhooks", "prometheus_client")
BLOCKER = f"""
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""
SECRET = "whsec_bGxtLWRiIGV4dHJhcyB0ZXN0IHNlY3JldCwgMzIgYnl0ZXM="


def python(code: str, *args: str, env: dict[str, str] | None = None):
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | (env or {})
    return subprocess.run([sys.executable, "-c", BLOCKER + code, *args], capture_output=True,
                          text=True, env=environ, timeout=60)  # fmt: skip


def test_the_blocker_really_blocks():
    proc = python("import httpx")
    assert proc.returncode != 0 and "No module named 'httpx'" in proc.stderr


def test_import_llm_db_and_the_driver_work_without_the_worker_extra(llm_dsn):
    proc = python(
        "import sys, uuid, psycopg, llm_db\n"
        "from llm_db import Llm, AsyncLlm, notices, cli\n"
        "llm = Llm(psycopg.connect(sys.argv[1], autocommit=True))\n"
        "org = uuid.uuid4()\n"
        "llm.upsert_organization(org, 'no extras', 100)\n"
        "inv = llm.admit(org, 10, 'model-x')\n"
        "assert llm.settle(org, inv.id, 9, 1) == 'settled'\n"
        "assert notices.new_secret().startswith('whsec_')\n"
        "assert AsyncLlm and llm_db.verify_webhook and llm_db.deliver_notices\n"
        f"loaded = [m for m in {BLOCKED!r} if m in sys.modules]\n"
        "assert loaded == [], loaded\n"
        "try:\n"
        "    llm_db.verify_webhook(b'{}', {}, notices.new_secret())\n"
        "except ImportError as exc:\n"
        "    print(exc)\n",
        llm_dsn,
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'llm-db[worker]'" in proc.stdout


@pytest.mark.parametrize(
    "command",
    [["worker", "--url", "http://127.0.0.1:9/"],
     ["notices", "deliver", "--url", "http://127.0.0.1:9/"],
     ["metrics"]],
    ids=["worker", "notices deliver", "metrics"],
)  # fmt: skip
def test_commands_that_need_the_extra_exit_2_naming_the_pip_line(llm_dsn, command):
    extra = ["--secret-env", "LLM_DB_TEST_SECRET"] if "--url" in command else []
    proc = python("from llm_db.cli import main\nmain(prog_name='llm-db')",
                  *command, *extra, "--dsn", llm_dsn,
                  env={"LLM_DB_TEST_SECRET": SECRET})  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"llm-db {' '.join(command[:2 if command[0] == 'notices' else 1])}: error:")
    assert "pip install 'llm-db[worker]'" in lines[0]


def test_commands_that_do_not_need_the_extra_still_run(llm_dsn):
    proc = python("from llm_db.cli import main\nmain(prog_name='llm-db')", "health", "--dsn", llm_dsn)
    assert proc.returncode == 2 and "never" in proc.stdout  # no pass yet: health's own exit 2
    secret = python("from llm_db.cli import main\nmain(prog_name='llm-db')", "notices", "new-secret")
    assert secret.returncode == 0 and secret.stdout.startswith("whsec_")
