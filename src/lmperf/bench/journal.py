"""The journal of a benchmark job: an append-only JSON-lines record, beside the job's CSV
(<folder>/.journal/<csv name>.jsonl), of the cases it started, finished and was interrupted in.

    {"event": "header", "fingerprint": {...grid, library versions...}, "code": {"commit", "digest"}}
    {"event": "start", "case_id": ...}
    {"event": "done", "case_id": ..., "rows": [...]}
    {"event": "interrupted", "case_id": ..., "signal": "SIGINT"}

A rerun reuses the rows of finished cases and measures the rest. A `start` that neither `done`
nor `interrupted` follows is a death: the process died in the case (an illegal memory access, a
kill -9); loop.run_cases records a case that died twice as an error instead of a third try.
Ctrl-C (SIGINT) and SIGTERM are interruptions, never deaths (interrupts_raise).

A journal written for another grid or library version, or by other code (another commit, or
other contents of the files the benchmark can import: lmperf.sources.digest), is discarded, and
`discarded` says why: a resume never mixes rows of two configurations or two versions of the code.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from pathlib import Path

SIGNALS = {signal.SIGINT, signal.SIGTERM}


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so that both end a case alike."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interrupts_raise():
    """Inside the block SIGTERM raises Interrupted (SIGINT raises KeyboardInterrupt already).
    Left as it is under torchrun, which stops the other ranks with SIGTERM when one rank dies:
    there it is a death. Only the main thread can set a handler; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread() or "TORCHELASTIC_RUN_ID" in os.environ:
        yield
        return

    def raise_interrupted(signum, frame):
        raise Interrupted(signum)
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def signal_number(exc: KeyboardInterrupt) -> int:
    return getattr(exc, "signum", signal.SIGINT)


class Journal:
    def __init__(self, out_csv: Path, fingerprint: dict, code: dict):
        out_csv = Path(out_csv)
        self.path = out_csv.parent / ".journal" / (out_csv.name + ".jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.header = {"event": "header", "fingerprint": fingerprint, "code": code}
        self.rows: dict[str, list[dict]] = {}  # finished cases
        self.starts: dict[str, int] = {}
        self.ends: dict[str, int] = {}  # done or interrupted
        self.open_case: str | None = None  # started by this process, not yet done
        self.discarded = self._load()
        self.f = open(self.path, "a")
        if not self.path.stat().st_size:
            self._write(self.header)

    def _load(self) -> str:
        """Read an existing journal; if it does not belong to this job, remove it and say why."""
        if not self.path.exists():
            return ""
        text = self.path.read_text()
        if text and not text.endswith("\n"):  # a line cut short by a crash: drop it, so that
            text = text[:text.rfind("\n") + 1]  # what this run appends starts on a line of its own
            self.path.write_text(text)
        events = [json.loads(line) for line in text.splitlines()]
        header = events[0] if events else {}
        reason = ""
        if header.get("fingerprint") != self.header["fingerprint"]:
            reason = "it was written for another grid or library version"
        elif header.get("code") != self.header["code"]:
            was = header.get("code") or {"commit": "not recorded", "digest": "not recorded"}
            now = self.header["code"]
            reason = (f"it ran other code (commit {was['commit']}, code digest {was['digest'][:12]}; "
                      f"now {now['commit']}, {now['digest'][:12]})")
        if reason or not events:
            self.path.unlink()
            return reason and f"{self.path} is discarded: {reason}"
        for ev in events[1:]:
            case_id = ev["case_id"]
            if ev["event"] == "start":
                self.starts[case_id] = self.starts.get(case_id, 0) + 1
            else:
                self.ends[case_id] = self.ends.get(case_id, 0) + 1
                if ev["event"] == "done":
                    self.rows[case_id] = ev["rows"]
        return ""

    def deaths(self, case_id: str) -> int:
        """How many times a process died in this case (started, never done nor interrupted)."""
        return max(0, self.starts.get(case_id, 0) - self.ends.get(case_id, 0))

    def _write(self, event: dict):
        # Ctrl-C or SIGTERM waits until the line is on disk: an event is never cut in two by them
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            self.f.write(json.dumps(event) + "\n")
            self.f.flush()
            os.fsync(self.f.fileno())
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def start(self, case_id: str):
        self._write({"event": "start", "case_id": case_id})
        self.starts[case_id] = self.starts.get(case_id, 0) + 1
        self.open_case = case_id

    def done(self, case_id: str, rows: list[dict]):
        self._write({"event": "done", "case_id": case_id, "rows": rows})
        self.rows[case_id] = rows
        if self.open_case == case_id:  # not a case recorded without a start (one that died twice)
            self.ends[case_id] = self.ends.get(case_id, 0) + 1
        self.open_case = None

    def interrupted(self, case_id: str, signum: int):
        self._write({"event": "interrupted", "case_id": case_id, "signal": signal.Signals(signum).name})
        self.ends[case_id] = self.ends.get(case_id, 0) + 1
        self.open_case = None

    def keep(self, case_ids: list[str]):
        """Rewrite the journal with the finished cases `case_ids` and the deaths of every case,
        so that a rerun measures only the others (and still counts the deaths)."""
        events = [self.header]
        events += [{"event": "done", "case_id": c, "rows": self.rows[c]} for c in case_ids]
        events += [{"event": "start", "case_id": c} for c in self.starts for _ in range(self.deaths(c))]
        self.f.close()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(ev) + "\n" for ev in events))
        os.replace(tmp, self.path)

    def remove(self):
        self.f.close()
        self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()
