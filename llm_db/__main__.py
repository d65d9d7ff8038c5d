"""``python -m llm_db`` and the ``llm-db`` script: the command line of ``llm_db.cli``.

The command line is built on click, which comes with the ``cli`` extra. Without
it, this prints one line naming ``pip install 'llm-db[cli]'`` and exits 2 (the
exit code of a usage error), where importing ``llm_db.cli`` would end in a
traceback.
"""

from __future__ import annotations

import sys

from llm_db._extras import MissingExtra

__all__ = ["main"]


def main() -> None:
    """Run ``llm-db`` with the arguments of this process."""
    try:
        from llm_db.cli import main as cli
    except MissingExtra as exc:
        print(f"llm-db: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    cli(prog_name="llm-db")


if __name__ == "__main__":
    main()
