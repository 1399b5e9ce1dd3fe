"""``specpilot-mem sql "SELECT ..."``: read-only SQL over the registry.

Tables: entries, requirements, options, variants, evidence, figures, untested, deployments, rounds,
promotions, files, meta (``specpilot-mem sql "SELECT table_name FROM duckdb_tables()"`` lists them).
Only one SELECT (or WITH ... SELECT) statement runs; the database is opened read-only, without file
access, so a statement can neither change the registry nor read or write other files.
"""

from __future__ import annotations

import datetime as dt
import decimal

from specpilot_mem.output import console, emit, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "sql", parents=[common], help="run a read-only SQL query over the registry", description=__doc__
    )
    parser.add_argument("statement", metavar="SQL", help='one SELECT statement, e.g. "SELECT id, title FROM entries"')
    parser.set_defaults(func=run)


def check_read_only(statement: str) -> str:
    """The statement if it is exactly one SELECT; a RegistryError naming what it is otherwise."""
    import duckdb

    from specpilot_mem.errors import RegistryError

    try:
        parsed = duckdb.extract_statements(statement)
    except duckdb.Error as err:
        raise RegistryError(f"the SQL does not parse: {err}", where="SQL", fix="check the statement's syntax") from None
    if len(parsed) != 1:
        raise RegistryError(f"expected one statement, got {len(parsed)}", where="SQL", fix="run one SELECT at a time")
    kind = parsed[0].type
    if kind != duckdb.StatementType.SELECT:
        raise RegistryError(
            f"only SELECT statements run here; this is {kind.name}",
            where="SQL",
            fix="the registry is rebuilt from the records: change entries/ or rounds/ and run `specpilot-mem registry sync`",
        )
    return statement


def _cell(value):
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_cell(v) for v in value]
    if isinstance(value, dict):
        return {k: _cell(v) for k, v in value.items()}
    return value


def run(args) -> int:
    import duckdb

    from specpilot_mem.errors import RegistryError
    from specpilot_mem.home import find_home
    from specpilot_mem.registry.sync import connect, seal

    statement = check_read_only(args.statement)
    con = seal(connect(find_home(args.home)))
    try:
        cursor = con.execute(statement)
        columns = [d[0] for d in cursor.description]
        rows = [[_cell(v) for v in row] for row in cursor.fetchall()]
    except duckdb.Error as err:
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY table_name").fetchall()]
        raise RegistryError(f"the query failed: {err}", where="SQL", fix="tables: " + ", ".join(tables)) from None
    finally:
        con.close()

    def render(data) -> None:
        cells = [["" if v is None else str(v) for v in row] for row in data["rows"]]
        result = table(None, data["columns"], cells)
        for column in result.columns:
            column.overflow = "fold"  # wrap long values instead of cutting them off
        console.print(result)
        console.print(f"{len(data['rows'])} row{'' if len(data['rows']) == 1 else 's'}")

    emit(args, {"columns": columns, "rows": rows}, render)
    return 0
