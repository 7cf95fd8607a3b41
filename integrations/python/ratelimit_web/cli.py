"""`ratelimit-web`: policies and blocks from the command line, over a database URL
(PostgreSQL: `postgresql://...` or a libpq string such as `dbname=app`) or a SQLite file.

    ratelimit-web --db app.db policy set login '{"limits": [{"burst": 5, "refill_per_minute": 5}]}'
    ratelimit-web --db app.db policy list
    ratelimit-web --db app.db policy drop login
    ratelimit-web --db app.db block ip:203.0.113.9 --seconds 3600
    ratelimit-web --db app.db blocks
    ratelimit-web --db app.db unblock ip:203.0.113.9
    ratelimit-web --db postgresql://ops@db/app top            # refreshed every 2 s; --once prints once

`--db` defaults to RATELIMIT_DATABASE. On PostgreSQL, setting and dropping policies and
lifting blocks need a member of rl_admin (or the extension's owner), and so does `top`,
which shows rl_check's counts per policy, the subjects refused most and the blocks in force. An error of the engine
is printed as it says it, with exit status 1."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import unicodedata
from typing import List, Optional

from .rules import database_of

# What a terminal must never be sent raw: controls (C0, DEL, C1, which move the cursor,
# clear the screen, set the title or write the clipboard), format characters (bidirectional
# overrides, zero-width ones), line and paragraph separators, and code points that are
# unassigned, private or lone surrogates.
_HIDDEN = frozenset(("Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"))
# The widest a subject or key is shown in a table (the rest is cut, with an ellipsis).
CELL_CHARS = 64


def visible(text) -> str:
    """`text` safe to write to a terminal: every character a terminal would act on, or
    that hides or reorders what follows, written as its \\uXXXX escape (the same one JSON
    uses), the rest as it is."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in _HIDDEN:
            code = ord(ch)
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def cell(value, width: int = CELL_CHARS) -> str:
    """A table cell: visible, and at most `width` characters."""
    text = "" if value is None else visible(value)
    return text if len(text) <= width else text[:width - 1] + "\u2026"


class Database:
    """One connection, PostgreSQL (psycopg 3) or SQLite (the extension of the sqlite-ratelimit
    package, or RATELIMIT_SQLITE_EXTENSION)."""

    def __init__(self, db: str, extension: Optional[str] = None):
        kind, where = database_of(db)
        if kind == "postgres":
            import psycopg

            self.conn = psycopg.connect(where, autocommit=True)
            self.p = "%s"
        else:
            from .limiter import _extension, _sqlite_connect

            self.conn = _sqlite_connect(where, extension or os.environ.get("RATELIMIT_SQLITE_EXTENSION") or _extension(None), 5.0)
            self.p = "?"

    def rows(self, sql: str, params=()) -> list:
        cur = self.conn.execute(sql.replace("?", self.p), params)
        return cur.fetchall() if cur.description is not None else []

    def value(self, sql: str, params=()):
        rows = self.rows(sql, params)
        value = rows[0][0] if rows else None
        return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value


SCOPES = {
    "server": "the whole server's, since rl_stats_reset()",
    "session": "this command's own session only: preload pg_ratelimit to see the server's",
    "process": "this command's own process only: SQLite keeps them in each process (read the application's metrics)",
}


def table(title: str, header: List[str], rows: List[list], left: int = 1) -> List[str]:
    """A titled table in fixed columns, the first `left` left-aligned (names), the rest
    right-aligned (numbers)."""
    cells = [header] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["", title]
    for r in cells:
        lines.append("  ".join(v.ljust(w) if i < left else v.rjust(w)
                               for i, (v, w) in enumerate(zip(r, widths))).rstrip())
    if not rows:
        lines.append("(none)")
    return lines


# `top` lists the budgets of this period from this share of their quota up (rl_budgets_near).
NEAR_FRACTION = 0.8


def top_screen(db: "Database", n: int) -> str:
    """What `top` shows: rl_check's counts per policy, the subjects refused most, the
    blocks in force and the budgets near their quota, each read from the database."""
    stats = db.value("SELECT rl_policy_stats()")
    policies = sorted(stats["policies"].items())
    refused = []
    for name, _ in policies:
        top = db.value("SELECT rl_top_refused(?, ?)", (name, n))
        refused += [[name, e["subject"], e["refusals"], e["error"],
                     time.strftime("%H:%M:%S", time.gmtime(e["last_refused_ms"] / 1000))] for e in top["subjects"]]
    refused.sort(key=lambda r: -r[2])
    now_ms = time.time() * 1000
    blocks = [[subject, strikes, "until unblocked" if until is None else f"{max(0, until - now_ms) / 1000:.0f} s more"]
              for subject, strikes, until in db.rows("SELECT subject, strikes, blocked_until_ms FROM rl_blocks ORDER BY subject")]
    lines = [f"ratelimit-web top  {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
             f"counts: {stats['scope']} ({SCOPES.get(stats['scope'], '')})"]
    lines += table("POLICIES", ["policy", "admitted", "refused", "refused blocked", "shadow would refuse"],
                   [[name, c["admitted"], c["refused"], c["refused_blocked"], c["would_refuse"]] for name, c in policies])
    lines += table("MOST REFUSED", ["policy", "subject", "refusals", "error", "last (UTC)"], refused[:n], 2)
    lines += table("BLOCKED NOW", ["subject", "strikes", "ends"], blocks)
    near = db.value("SELECT rl_budgets_near(?, ?)", (NEAR_FRACTION, n))["budgets"]
    lines += table(f"NEAR THEIR QUOTA ({NEAR_FRACTION:.0%} or more)", ["key", "period", "used", "quota", "share", "resets (UTC)"],
                   [[b["key"], b["period"], b["used"], b["quota"], f"{100 * b['used'] / b['quota']:.1f} %",
                     time.strftime("%Y-%m-%d %H:%M", time.gmtime(b["resets_at"]))] for b in near], 2)
    return "\n".join(lines) + "\n"


def top(db: "Database", n: int, interval: float, once: bool) -> None:
    if once:
        sys.stdout.write(top_screen(db, n))
        return
    # (every subject and key on the screen went through `visible`: the only escapes written
    # are this clear-screen and nothing else)
    try:
        while True:
            screen = top_screen(db, n)
            sys.stdout.write("\x1b[H\x1b[2J" + screen + f"\n(every {interval:g} s; Ctrl-C quits)\n")
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        pass


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ratelimit-web", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=os.environ.get("RATELIMIT_DATABASE"),
                        help="postgresql://... or a libpq string (dbname=app), or a SQLite file (default: RATELIMIT_DATABASE)")
    commands = parser.add_subparsers(dest="command", required=True)
    policy = commands.add_parser("policy", help="set, list or drop policies").add_subparsers(dest="action", required=True)
    set_ = policy.add_parser("set", help="insert or replace a policy; prints it as stored")
    set_.add_argument("name")
    set_.add_argument("definition", help='JSON, e.g. \'{"limits": [{"burst": 5, "refill_per_minute": 5}]}\'')
    policy.add_parser("list", help="every policy and its definition, one JSON object a line")
    drop = policy.add_parser("drop", help="delete a policy")
    drop.add_argument("name")
    block = commands.add_parser("block", help="block a subject (rl_block)")
    block.add_argument("subject")
    block.add_argument("--seconds", type=float, default=None, help="how long (default: until unblocked)")
    unblock = commands.add_parser("unblock", help="lift a subject's block and forget its strikes")
    unblock.add_argument("subject")
    commands.add_parser("blocks", help="the subjects blocked now, one JSON object a line")
    watch = commands.add_parser("top", help="counts per policy, the subjects refused most and the blocks, refreshed")
    watch.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    watch.add_argument("-n", type=int, default=10, help="subjects refused most to show (1 to 64, default 10)")
    watch.add_argument("--once", action="store_true", help="print the view once and exit")
    args = parser.parse_args(argv)
    say = lambda text: print(visible(text))  # noqa: E731 - names and subjects, as the terminal shows them
    if not args.db:
        parser.error("give --db (or set RATELIMIT_DATABASE)")
    try:
        db = Database(args.db)
        if args.command == "policy" and args.action == "set":
            cast = "::jsonb" if db.p == "%s" else ""
            print(json.dumps(db.value(f"SELECT rl_policy_set(?, ?{cast})", (args.name, args.definition))))
        elif args.command == "policy" and args.action == "list":
            for name, definition in db.rows("SELECT name, definition FROM rl_policies ORDER BY name"):
                definition = json.loads(definition) if isinstance(definition, str) else definition
                print(json.dumps({"name": name, "definition": definition}))
        elif args.command == "policy":
            dropped = db.value("SELECT rl_policy_drop(?)", (args.name,))
            say(f"dropped {args.name}" if dropped else f"there was no policy named {args.name}")
        elif args.command == "block":
            print(json.dumps(db.value("SELECT rl_block(?, ?)", (args.subject, args.seconds))))
        elif args.command == "top":
            top(db, args.n, args.interval, args.once)
        elif args.command == "unblock":
            lifted = db.value("SELECT rl_unblock(?)", (args.subject,))
            say(f"unblocked {args.subject}" if lifted else f"{args.subject} was not blocked")
        else:
            for subject, strikes, until in db.rows("SELECT subject, strikes, blocked_until_ms FROM rl_blocks ORDER BY subject"):
                print(json.dumps({"subject": subject, "strikes": strikes, "blocked_until_ms": until}))
    except Exception as e:  # noqa: BLE001 - the engine's words, as it says them
        print(visible(f"ratelimit-web: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
