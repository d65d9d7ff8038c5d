"""``llm-db notices deliver``, ``notices new-secret`` and ``worker``: threshold
notices delivered to a webhook, one run or continuously."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click
import psycopg

from llm_db.cli.commands import common

DEFAULT_SECRET_ENV = "LLM_DB_WEBHOOK_SECRET"


# ----------------------------------------------------------- notices


def _webhook_secrets(secret_env: str) -> list[str]:
    """The whsec_ secrets in $secret_env (several separated by spaces), or exit 2."""
    from llm_db.service.notices import parse_secrets

    value = os.environ.get(secret_env)
    if not value or not value.strip():
        raise click.UsageError(
            f"environment variable {secret_env} is not set: the webhook secret is read from the "
            "environment (--secret-env NAME), never from the command line; make one with "
            "`llm-db notices new-secret`"
        )
    return parse_secrets(value)  # InvalidSecret: exit 2, saying how to make one


def _check_http_url(url: str) -> None:
    if not re.match(r"^https?://", url, re.IGNORECASE):
        raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint="--url")


def url_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--url", required=True,
                        help="http(s) URL the notices are POSTed to, as JSON.")(f)  # fmt: skip


def secret_env_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--secret-env",
        default=DEFAULT_SECRET_ENV,
        show_default=True,
        metavar="NAME",
        help="Environment variable holding the Standard Webhooks secret, whsec_... (several, "
        "separated by spaces, while rotating: one signature each). Never the secret itself.",
    )(f)


@click.group(cls=common.Group, short_help="Deliver threshold notices to a webhook.")
def notices() -> None:
    """Threshold notices (80 %, 100 % of the allowance): deliver them to a webhook.

    Deliveries follow Standard Webhooks (standardwebhooks.com): headers
    webhook-id (the notice id, the same on every retry), webhook-timestamp and
    webhook-signature (v1,<base64 HMAC-SHA256 of id.timestamp.body>, one per
    secret). For continuous delivery run `llm-db worker`.
    """


@notices.command("deliver", short_help="Claim due notices and POST them, signed; one run.")
@common.dsn_option
@url_option
@secret_env_option
@click.option("--limit", type=click.IntRange(1, 10000), default=50, show_default=True,
              help="Notices claimed in this run.")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds for the connect and for each read and write.")  # fmt: skip
@common.now_option
@common.json_option
def notices_deliver(
    dsn: str | None,
    url: str,
    secret_env: str,
    limit: int,
    timeout: float,
    now: datetime | None,
    as_json: bool,
) -> None:
    """Claim due notices and POST each, signed, to --url; one run.

    Each POST is signed as Standard Webhooks with every secret in the
    environment variable --secret-env (a receiver verifies with the
    standardwebhooks package, or llm_db.service.notices.verify_webhook). A 2xx marks the
    notice sent; anything else leaves it owed with the error and a backoff, for
    a later run. A claim that expired and was claimed again by another deliverer
    before this run ended it is counted lost (a warning on stderr each) and left
    to that deliverer. Exit 0 when every claimed notice was delivered (or none was
    due), 1 when some were not (failed or lost), 2 when the secret is not
    whsec_... (make one with `llm-db notices new-secret`) or the worker extra is
    missing.

    \b
    Examples:
      export LLM_DB_WEBHOOK_SECRET=whsec_...       # from your secret store
      llm-db notices deliver --dsn ... --url https://hooks.example.com/llm
      # while rotating: both secrets, each delivery signed with each
      LLM_DB_WEBHOOK_SECRET="whsec_new... whsec_old..." llm-db notices deliver --url ...
    """
    dsn = common.require_dsn(dsn)
    common.require_extras()
    secrets = _webhook_secrets(secret_env)
    _check_http_url(url)
    from llm_db.client import Llm
    from llm_db.service.notices import deliver_notices

    with common.connect(dsn) as conn:
        summary = deliver_notices(Llm(conn), url, secrets, limit=limit, timeout=timeout, now=now)
    if as_json:
        common.echo_json(dataclasses.asdict(summary))
    else:
        line = f"claimed {summary.claimed}, sent {summary.sent}, failed {summary.failed}"
        if summary.lost:
            line += f", lost {summary.lost}"
        if summary.last_error:
            line += f"; last error: {summary.last_error}"
        click.echo(line)
    common.exit_with(common.EXIT_PROBLEM if summary.failed or summary.lost else common.EXIT_OK)


@notices.command("new-secret", short_help="Print a fresh whsec_ webhook secret.")
@click.option("--bytes", "nbytes", type=click.IntRange(24, 64), default=32, show_default=True,
              help="Random bytes in the secret (Standard Webhooks: 24 to 64).")  # fmt: skip
def notices_new_secret(nbytes: int) -> None:
    """Print a fresh random secret in the Standard Webhooks form whsec_<base64>.

    Give it to the receiver and put it in the deliverer's environment. To rotate
    without a gap: set the variable to "NEW OLD" (both signed), switch the
    receiver to NEW, then drop OLD.

    \b
    Examples:
      llm-db notices new-secret
      export LLM_DB_WEBHOOK_SECRET="$(llm-db notices new-secret)"
    """
    from llm_db.service.notices import new_secret

    click.echo(new_secret(nbytes))


# ----------------------------------------------------------- worker


class _Address(click.ParamType):
    name = "HOST:PORT"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, int]:
        from llm_db.service.worker import parse_address

        if isinstance(value, tuple):
            return value
        try:
            return parse_address(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command(short_help="Deliver notices continuously; serve /metrics and /healthz.")
@common.dsn_option
@url_option
@secret_env_option
@click.option("--metrics-addr", type=_Address(), default="127.0.0.1:9187", show_default=True,
              help="Where /metrics and /healthz are served (port 0: any free port).")  # fmt: skip
@click.option("--poll", type=click.FloatRange(min=0.05), default=30.0, show_default=True,
              help="Seconds between looks for due notices when no NOTIFY arrives.")  # fmt: skip
@click.option("--limit", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Notices claimed at a time.")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds for the connect and for each read and write of a POST; "
              "--limit x --timeout must stay below llm.settings.notice_claim_timeout.")
@click.option("--log-json", is_flag=True, help="Log one JSON object per line instead of text.")
def worker(
    dsn: str | None,
    url: str,
    secret_env: str,
    metrics_addr: tuple[str, int],
    poll: float,
    limit: int,
    timeout: float,
    log_json: bool,
) -> None:
    """Deliver threshold notices continuously, and serve /metrics and /healthz.

    A long-running process. It LISTENs on channel llm_notices: the transaction
    that makes a notice owed (a settlement or recovery crossing a threshold, a
    retry, a release, a re-arm) notifies at commit, and the worker delivers at
    once; --poll is the fallback (under Citus the only path). Each POST is
    signed as Standard Webhooks; a failure leaves the notice owed with a
    backoff. /metrics is the `llm-db metrics` exposition plus
    llm_notice_deliveries_total{outcome}; /healthz is 200 when the database
    answers and the pass is healthy, 503 otherwise.

    SIGTERM or SIGINT: the notice being POSTed is finished, every other claimed
    notice is released (owed, due at once), exit 0. It needs a session of its
    own for LISTEN: a direct connection, or PgBouncer in session mode (exit 2
    otherwise). Exit 4 when the database cannot be reached at start; later
    outages are logged and retried. One log line per event on stderr.

    \b
    Examples:
      export LLM_DB_WEBHOOK_SECRET=whsec_...
      llm-db worker --dsn postgresql://notifier@db/app --url https://hooks.example.com/llm
      llm-db worker --url https://hooks.example.com/llm --metrics-addr 0.0.0.0:9187 --log-json
    """
    dsn = common.require_dsn(dsn)
    common.require_extras()
    secrets = _webhook_secrets(secret_env)
    _check_http_url(url)
    from llm_db.service.worker import ConfigError, SessionRequired, Worker, WorkerConfig

    config = WorkerConfig(
        dsn=dsn, url=url, secrets=secrets, metrics_addr=metrics_addr, poll=poll, limit=limit,
        timeout=timeout, log_json=log_json,
    )  # fmt: skip
    try:
        code = Worker(config).run()
    except (ConfigError, SessionRequired) as exc:
        raise common.Failure(str(exc), common.EXIT_USAGE) from exc
    except psycopg.OperationalError as exc:
        raise common.Failure(f"cannot connect (--dsn): {exc}", common.EXIT_ERROR) from exc
    common.exit_with(code)
