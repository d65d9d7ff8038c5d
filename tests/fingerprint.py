"""A fingerprint of the books: every table of schema ``llm``, hashed row by row
in primary-key order, so "nothing changed" is one comparison of two dicts.

Used by the interruption, bad-input and restart suites. A table added later is
included automatically (the list comes from the catalog, not from this file).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

# Tables of schema llm with their primary-key columns, in key order.
_TABLES = """
SELECT c.relname,
       array_agg(a.attname::text ORDER BY k.ord) FILTER (WHERE a.attname IS NOT NULL) AS pk,
       EXISTS (SELECT FROM pg_catalog.pg_attribute AS o
                WHERE o.attrelid = c.oid AND o.attname = 'organization_id' AND NOT o.attisdropped)
       AS per_org
  FROM pg_catalog.pg_class AS c
  LEFT JOIN pg_catalog.pg_index AS i ON i.indrelid = c.oid AND i.indisprimary
  LEFT JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
  LEFT JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.oid AND a.attnum = k.attnum
 WHERE c.relnamespace = 'llm'::regnamespace AND c.relkind IN ('r', 'p')
 GROUP BY c.oid, c.relname
 ORDER BY c.relname
"""


def llm_tables(conn: psycopg.Connection) -> list[tuple[str, list[str], bool]]:
    """(table, primary-key columns, has organization_id) for every table of schema llm."""
    return [(name, list(pk or []), per_org) for name, pk, per_org in conn.execute(_TABLES)]


def fingerprint(conn: psycopg.Connection, organization_id: object | None = None) -> dict[str, tuple[int, str]]:
    """{table: (row count, md5 of all rows in primary-key order)} over schema llm.

    With ``organization_id``, only that tenant's books: tables that carry the
    column restricted to its rows, ``organizations`` to its own row; catalogs
    and coordinator tables (``reconciliation_runs``) are left out. So one
    tenant's books can be compared while another's legitimately moved.
    """
    result: dict[str, tuple[int, str]] = {}
    for table, pk, per_org in llm_tables(conn):
        order = sql.SQL(", ").join(sql.Identifier("t", col) for col in pk) if pk else sql.SQL("t::text")
        where = sql.SQL("")
        params: list[object] = []
        if organization_id is not None:
            if per_org:
                where = sql.SQL(" WHERE t.organization_id = %s")
                params = [organization_id]
            elif table == "organizations":
                where = sql.SQL(" WHERE t.id = %s")
                params = [organization_id]
            else:
                continue
        query = sql.SQL(
            "SELECT count(*), md5(coalesce(string_agg(t::text, E'\\n' ORDER BY {order}), ''))"
            " FROM llm.{table} AS t{where}"
        ).format(order=order, table=sql.Identifier(table), where=where)
        count, digest = conn.execute(query, params).fetchone()
        result[table] = (count, digest)
    return result


def changed_tables(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]]) -> list[str]:
    """Names of the tables whose fingerprint differs (or that appeared or vanished)."""
    return sorted(t for t in before.keys() | after.keys() if before.get(t) != after.get(t))
