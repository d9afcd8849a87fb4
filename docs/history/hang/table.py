"""Summarise measure.py's JSON lines as Markdown: one line per mode, then one row per run.

    python docs/history/hang/table.py RAW.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys


def exit_seconds(rec: dict, rank: str) -> float | None:
    """From the rank's return from main() to its process gone: its interpreter's exit."""
    returned, ended = rec["main_returned"].get(rank), rec["process_ended"].get(rank)
    return None if returned is None or ended is None else ended - returned


def at_exit(rec: dict) -> bool:
    """A hang at exit: every rank still alive at the limit had left main() before it."""
    limit = rec.get("limit", 75)  # the first records were taken with 75 s, before it was kept
    return rec["hung"] and all(rec["main_returned"].get(r, limit) < limit for r in rec["stuck_ranks"])


def main() -> None:
    recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    modes = list(dict.fromkeys(r["mode"] for r in recs))
    print("| mode | runs | hung at exit | still in main() at the limit | rank stuck | exit code != 0 | 'terminate called' | survivors |"
          " rank 0 exit s (median, max) | rank 1 exit s (median, max) | rank 1 gone first |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        rs = [r for r in recs if r["mode"] == mode]
        hung = [r for r in rs if at_exit(r)]
        slow = [r for r in rs if r["hung"] and not at_exit(r)]
        stuck = sorted({s for r in hung for s in r["stuck_ranks"]})
        bad = [r for r in rs if not r["hung"] and r["rc"] != 0]
        cols = []
        for rank in ("0", "1"):
            xs = [x for r in rs if (x := exit_seconds(r, rank)) is not None]
            cols.append(f"{statistics.median(xs):.1f}, {max(xs):.1f}" if xs else "-")
        first = sum(1 for r in rs if r["process_ended"].get("1", 1e9) <= r["process_ended"].get("0", 1e9))
        print(f"| {mode} | {len(rs)} | {len(hung)} | {len(slow)} | {', '.join(stuck) or '-'} | {len(bad)} | "
              f"{sum(r['terminate_called'] > 0 for r in rs)} | {sum(len(r['survivors']) for r in rs)} | "
              f"{cols[0]} | {cols[1]} | {first} of {len(rs)} |")
    print()
    print("| mode | i | exit code | seconds | hung | stuck ranks | rank 0 / 1 left main() at s |"
          " rank 0 / 1 process gone at s | 'terminate called' |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        ret, end = r["main_returned"], r["process_ended"]
        print(f"| {r['mode']} | {r['i']} | {r['rc']} | {r['seconds']:.1f} | {'yes' if r['hung'] else 'no'} | "
              f"{', '.join(r['stuck_ranks']) or '-'} | {ret.get('0', '-')} / {ret.get('1', '-')} | "
              f"{end.get('0', '-')} / {end.get('1', '-')} | {r['terminate_called']} |")


if __name__ == "__main__":
    main()
