"""What works without the extras.

The ``worker`` extra: httpx, standardwebhooks and prometheus_client are
imported only by what needs them, and the commands that need them exit 2 with one line
naming ``pip install 'llm-db[worker]'``.

The slim core install: the one core dependency is psycopg (0.4.0: migrate needs
no yoyo-migrations, whose record it keeps; the core environment blocks ``yoyo``).
``import llm_db``, the driver and ``migrate`` work with nothing else; the pytest plugin
(opt-in since 0.3.0) loads without ``testing.postgresql`` and a fixture that
starts the server fails naming the ``testing`` extra; ``llm-db`` without click prints one
line naming the ``cli`` extra.

Each check runs in a fresh interpreter whose ``sys.meta_path`` refuses those modules, as
if they were not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import uuid
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BLOCKED = ("httpx", "standardwebhooks", "prometheus_client")
# what a core install (`pip install llm-db`) lacks: every extra's modules ("testing" is
# testing.postgresql's namespace, with testing.common), and yoyo, which only the suite
# installs
NOT_IN_CORE = ("click", "testing", "yoyo", *BLOCKED)
CORE = {"psycopg"}


def blocker(names: tuple[str, ...]) -> str:
    """Python code that makes ``names`` (and their submodules) unimportable."""
    return f"""
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""


BLOCKER = blocker(BLOCKED)
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
        "from llm_db import Llm, AsyncLlm, cli\n"
        "from llm_db.service import notices\n"
        "llm = Llm(psycopg.connect(sys.argv[1], autocommit=True))\n"
        "org = uuid.uuid4()\n"
        "llm.upsert_organization(org, 'no extras', 100)\n"
        "inv = llm.admit(org, 10, 'model-x')\n"
        "assert llm.settle(org, inv.id, 9, 1) == 'settled'\n"
        "assert notices.new_secret().startswith('whsec_')\n"
        "assert AsyncLlm and notices.verify_webhook and notices.deliver_notices\n"
        f"loaded = [m for m in {BLOCKED!r} if m in sys.modules]\n"
        "assert loaded == [], loaded\n"
        "try:\n"
        "    notices.verify_webhook(b'{}', {}, notices.new_secret())\n"
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
    assert proc.returncode == 5 and "never" in proc.stdout  # no pass yet: health's own exit 5
    secret = python("from llm_db.cli import main\nmain(prog_name='llm-db')", "notices", "new-secret")
    assert secret.returncode == 0 and secret.stdout.startswith("whsec_")


# ---------------------------------------------------------------- the core install


def core_python(code: str, *args: str, block: tuple[str, ...] = NOT_IN_CORE):
    """Run ``code`` where ``block`` cannot be imported. ``AT_START``: the modules loaded
    before it ran (testing.common's nspkg .pth file makes empty ``testing`` and
    ``testing.common`` namespace modules at startup, wherever it is installed)."""
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    code = "AT_START = set(sys.modules)\n" + code
    return subprocess.run([sys.executable, "-c", blocker(block) + code, *args],
                          capture_output=True, text=True, env=environ, timeout=120)  # fmt: skip


@pytest.fixture
def core_env(tmp_path) -> dict[str, str]:
    """An environment whose Python processes (``python -m``, console scripts) cannot
    import what the core install lacks: a sitecustomize on PYTHONPATH installs the blocker."""
    site = tmp_path / "core-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(blocker(NOT_IN_CORE))
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), environ.get("PYTHONPATH")]))
    return environ


def requirement_name(requirement: str) -> str:
    """The project name of a requirement, normalized (PEP 503: prometheus_client is
    prometheus-client)."""
    name = re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def names(*modules: str) -> set[str]:
    return {requirement_name(m) for m in modules}


def test_the_core_dependency_is_psycopg_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert names(*project["dependencies"]) == CORE
    extras = project["optional-dependencies"]
    assert names(*extras["cli"]) == names("click")
    assert names(*extras["testing"]) == names("testing.postgresql")
    assert names(*extras["worker"]) == names(*BLOCKED)
    # the suite (scripts/bootstrap.sh) installs every extra
    assert "llm-db[cli,testing,worker]" in extras["test"]
    assert project["scripts"]["llm-db"] == "llm_db.__main__:main"


def test_the_wheel_requires_the_core_and_offers_the_extras(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("llm_db-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        (metadata,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(metadata).decode().splitlines()
    requires = [line.removeprefix("Requires-Dist: ") for line in lines
                if line.startswith("Requires-Dist: ")]  # fmt: skip
    core = {requirement_name(r) for r in requires if "extra ==" not in r}
    assert core == CORE, requires

    def extra(name: str) -> set[str]:
        return {requirement_name(r) for r in requires if f"extra == '{name}'" in r.replace('"', "'")}

    assert extra("cli") == names("click")
    assert extra("testing") == names("testing.postgresql")
    assert extra("worker") == names(*BLOCKED)
    assert {f"Provides-Extra: {e}" for e in ("cli", "testing", "worker", "test")} <= set(lines)


def test_the_core_blocker_really_blocks(core_env):
    for module in ("click", "testing.postgresql", "prometheus_client"):
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                              text=True, env=core_env, timeout=60)  # fmt: skip
        assert proc.returncode != 0 and "No module named" in proc.stderr, (module, proc.stderr)


def test_import_llm_db_its_plugin_and_its_servers_need_no_extra():
    proc = core_python(
        "import sys\n"
        "import llm_db, llm_db.testing, llm_db.testing._server, llm_db.testing._pgbouncer, llm_db.migrate\n"
        "from llm_db import Llm, AsyncLlm, migrate, with_llm_execution\n"
        "assert callable(migrate) and Llm and AsyncLlm and with_llm_execution\n"
        "loaded = sorted(m for m in set(sys.modules) - AT_START"
        f" if m.split('.')[0] in {NOT_IN_CORE!r})\n"
        "assert loaded == [], loaded\n"
    )
    assert proc.returncode == 0, proc.stderr


def test_the_driver_and_migrate_work_with_the_core_install_only(llm_server, llm_owner):
    name = f"core_{uuid.uuid4().hex}"
    dsn = llm_server.create_database(name, owner=llm_owner)
    try:
        proc = core_python(
            "import sys, uuid, psycopg\n"
            "from llm_db import Llm, migrate\n"
            "report = migrate(sys.argv[1])\n"
            "assert report.applied_migrations, report\n"
            "llm = Llm(psycopg.connect(sys.argv[1], autocommit=True))\n"
            "org = uuid.uuid4()\n"
            "llm.upsert_organization(org, 'core install', 100)\n"
            "inv = llm.admit(org, 10, 'model-x')\n"
            "llm.mark_dispatched(org, inv.id)\n"
            "assert llm.settle(org, inv.id, 9, 1) == 'settled'\n"
            "loaded = sorted(m for m in set(sys.modules) - AT_START"
            f" if m.split('.')[0] in {NOT_IN_CORE!r})\n"
            "assert loaded == [], loaded\n",
            dsn,
        )
        assert proc.returncode == 0, proc.stderr
    finally:
        llm_server.drop_database(name)


def consumer_pytest(tmp_path: Path, env: dict[str, str], tests: str, *, conftest: str = "",
                    args: tuple[str, ...] = ()) -> str:
    """Run pytest in a consumer project holding ``tests`` (and ``conftest``); its output."""
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    if conftest:
        (project / "conftest.py").write_text(conftest)
    (project / "test_consumer.py").write_text(tests)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rE", "-p", "no:cacheprovider", *args, "test_consumer.py"],
        cwd=project, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    return proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("conftest", "args"),
    [('pytest_plugins = ["llm_db.testing"]\n', ()), ("", ("-p", "llm_db.testing"))],
    ids=["conftest pytest_plugins", "-p llm_db.testing"],
)
def test_the_opted_in_plugin_loads_and_a_fixture_names_the_testing_extra(tmp_path, core_env, conftest, args):
    """The plugin is opt-in, by the rootdir's conftest or ``-p``."""
    out = consumer_pytest(
        tmp_path, core_env,
        "import sys\n\n"
        "def test_the_plugin_is_loaded(request):\n"
        "    assert request.config.pluginmanager.has_plugin('llm_db.testing')\n"
        "    assert 'testing.postgresql' not in sys.modules\n\n"
        "def test_a_fixture_that_starts_the_server(llm_dsn):\n"
        "    raise AssertionError('unreachable without the testing extra')\n",
        conftest=conftest, args=args,
    )  # fmt: skip
    assert re.search(r"\b1 passed, 1 error\b", out), out
    assert "ERROR test_consumer.py::test_a_fixture_that_starts_the_server" in out, out
    assert ("llm_server: testing.postgresql is not installed" in out
            and "pip install 'llm-db[testing]'" in out), out  # fmt: skip
    assert "Traceback" not in out and "ModuleNotFoundError" not in out, out


def test_installing_llm_db_adds_no_plugin_to_a_consumers_pytest(tmp_path):
    """No ``pytest11`` entry point, so a project that installs llm-db
    and does not opt in runs pytest without its plugin, its fixtures or llm_db itself."""
    out = consumer_pytest(
        tmp_path, {k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        "import sys\n\n"
        "def test_no_plugin(request):\n"
        "    assert not request.config.pluginmanager.has_plugin('llm_db.testing')\n"
        "    assert 'llm_db' not in sys.modules\n\n"
        "def test_no_fixture(llm_dsn):\n"
        "    pass\n",
    )  # fmt: skip
    assert re.search(r"\b1 passed, 1 error\b", out), out
    assert "fixture 'llm_dsn' not found" in out, out


CLI_MISSING = (
    "llm-db: error: click is not installed: the llm-db command needs the cli extra "
    "(pip install 'llm-db[cli]')"
)


@pytest.mark.parametrize(
    "how",
    [["{bin}/llm-db"], ["{python}", "-m", "llm_db"], ["{python}", "-m", "llm_db.cli"]],
    ids=["llm-db script", "python -m llm_db", "python -m llm_db.cli"],
)
@pytest.mark.parametrize("args", [["--help"], ["migrate", "--dsn", "postgresql://nowhere/x"]],
                         ids=["help", "migrate"])  # fmt: skip
def test_the_command_without_the_cli_extra_names_it_in_one_line(core_env, how, args):
    python = Path(sys.executable)
    command = [part.format(bin=python.parent, python=python) for part in how]
    if how[0] == "{bin}/llm-db":
        assert Path(command[0]).is_file(), "llm-db is installed with the package (bootstrap.sh)"
    proc = subprocess.run([*command, *args], capture_output=True, text=True, env=core_env,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [CLI_MISSING], proc.stderr


def test_the_cli_group_without_click_raises_the_named_extra():
    proc = core_python(
        "from llm_db._extras import MissingExtra\n"
        "import llm_db.cli, llm_db.cli.report  # the package and the report's rendering need no click\n"
        "try:\n"
        "    from llm_db.cli import main\n"
        "except MissingExtra as exc:\n"
        "    assert isinstance(exc, ImportError) and exc.name == 'click' and exc.extra == 'cli'\n"
        "    print(exc)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'llm-db[cli]'" in proc.stdout


def test_demo_without_the_testing_extra_exits_2_naming_it():
    proc = core_python(
        "from llm_db.cli import main\nmain(prog_name='llm-db')", "demo",
        block=("testing", *BLOCKED),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("llm-db demo: error: testing.postgresql is not installed")
    assert "pip install 'llm-db[testing]'" in lines[0]
