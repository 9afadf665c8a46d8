"""`sqlite/HotpotSQL-v0`: answer a question about the HotpotQA database by writing SQL. Tools: `schema()`,
`query(sql)` (runs in the sandbox, shows the first rows), `submit(sql)` (ends the episode; execution
accuracy decides)."""

from __future__ import annotations

from sleuth import ToolEnv, ToolError, tool
from sleuth_sql.db import SCHEMA
from sleuth_sql.verifier import SqlVerifier, run_sql


class SqlEnv(ToolEnv):
    instructions = ("Answer the question with one SQLite query over the database. Look at the schema, try "
                    "queries, then submit the final SQL query.")
    budget_unit = "queries"
    default_budget = 4

    def default_verifier(self) -> SqlVerifier:
        return SqlVerifier()

    def user_message(self, task) -> str:
        return f"Question: {task.question}\n\nSchema:\n{SCHEMA}"

    @tool
    def schema(self) -> str:
        """Show the database schema."""
        return SCHEMA

    @tool
    def query(self, sql: str) -> str:
        """Run a read-only SQL query and see the first 20 rows.

        Args:
            sql: one SQLite SELECT statement
        """
        if not sql.strip():
            raise ToolError("query needs a SQL statement")
        result = run_sql(self.verifier.sandbox, [sql])[0]
        if "error" in result:
            return f"error: {result['error']}"
        rows = result["rows"]
        shown = "\n".join(" | ".join(map(str, r)) for r in rows[:20])
        return f"{len(rows)}{'+' if len(rows) > 1000 else ''} rows\n{shown}"

    @tool(final=True)
    def submit(self, sql: str) -> str:
        """Submit the final SQL query.

        Args:
            sql: the query whose result answers the question
        """
        return sql.strip().strip("`").removeprefix("sql").strip()
