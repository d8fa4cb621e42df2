"""What a check hands back, and how a grader stops at the first thing that is wrong.

A grader runs the learner's function on its cases and either returns the sentence that says what
it checked, or raises `Failure(message, diagnosis)` at the first case that is wrong. `diagnosis`
names the known mistake whose behaviour the learner's matches: the candidates are plain
functions that make one mistake each, and the one that agrees with the learner on every case
(else on the failing one) is named. `call` runs the learner's function and turns its exceptions
into the same vocabulary: NotImplementedError means "not written yet", anything else is reported
with the case it happened on.
"""
import html
from dataclasses import dataclass

import torch


class NotWritten(Exception):
    """The learner's function raised NotImplementedError: the starter is still a stub."""


class Failure(Exception):
    """A check failed: `message` says what and on which case; `diagnosis` names the known mistake."""

    def __init__(self, message: str, diagnosis: str | None = None):
        super().__init__(message)
        self.message, self.diagnosis = message, diagnosis


@dataclass(frozen=True)
class Exercise:
    name: str
    solution: object  # the reference implementation, a function with the learner's signature
    grade: object  # grade(fn) -> the sentence saying what was checked; raises Failure or NotWritten
    mistakes: dict  # diagnosis -> what that mistake does, a sentence or two for the learner


@dataclass
class Report:
    """The result of `check(name, fn)`: shown as a green or red box in a notebook."""
    exercise: str  # the exercise's name
    passed: bool
    message: str  # what failed and on which case, or what was checked
    diagnosis: str | None = None  # the known mistake the behaviour matches, or None
    hint: str = ""  # what the diagnosed mistake does, in a sentence
    reference: bool = False  # the function graded was the library's own solution, not the learner's

    @property
    def verdict(self) -> str:
        """What passed: a stored chapter grades the reference (SPECDEC_LAB_EXERCISES=reference), and says so."""
        if not self.reference:
            return "passed"
        return ("the reference solution passed (the saved output grades it; in your own kernel the cell grades "
                "your function, which raises NotImplementedError until you write it)")

    @property
    def said(self) -> str:
        """The message, about the reference where the reference was graded ("Your step ran" -> "Its step ran")."""
        if self.reference and self.message.startswith(("Your ", "You ")):
            return ("Its " if self.message.startswith("Your ") else "It ") + self.message.split(" ", 1)[1]
        return self.message

    def __repr__(self):
        if self.passed:
            return f"{self.exercise}: {self.verdict}. {self.said}"
        lines = [f"{self.exercise}: not yet. {self.message}"]
        if self.diagnosis:
            lines.append(f"Diagnosis: {self.diagnosis}. {self.hint}".rstrip())
        return "\n".join(lines)

    def _repr_html_(self):
        colour, background, verdict = (("#1a7f37", "#e6f4ea", "Passed") if self.passed
                                       else ("#b42318", "#fdecea", "Not yet"))
        head = f"{verdict}: {html.escape(self.exercise)}."
        if self.passed and self.reference:
            head = f"{html.escape(self.exercise)}: {html.escape(self.verdict)}."
        body = f"<p style='margin:0'><b>{head}</b> {html.escape(self.said)}</p>"
        if not self.passed and self.diagnosis:
            body += (f"<p style='margin:6px 0 0 0'><b>Diagnosis: <code>{html.escape(self.diagnosis)}</code>.</b> "
                     f"{html.escape(self.hint)}</p>")
        return (f"<div style='border:2px solid {colour};background:{background};color:#111;"
                f"border-radius:6px;padding:8px 12px;margin:4px 0'>{body}</div>")


def call(fn, args, case: str, on_error=None):
    """fn(*args). NotImplementedError -> NotWritten; another exception -> Failure naming `case`
    (a phrase such as "alpha = 1 and k = 4"), with the diagnosis on_error(exc) gives, if any."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise NotWritten from None
    except Exception as exc:  # the learner's code: any error is something to report, not to crash on
        diagnosis = on_error(exc) if on_error is not None else None
        raise Failure(f"Your function raised {type(exc).__name__} ({exc}) on {case}.", diagnosis) from None


def safe(fn, *args):
    """fn(*args), or None where a mistake's candidate has no answer for this case (it would raise)."""
    try:
        return fn(*args)
    except Exception:  # a candidate that crashes on a case simply does not match it
        return None


def grade_cases(fn, cases, reference, mistakes, *, describe, explain, read=lambda out, case: out,
                same=lambda a, b: a == b, on_error=None):
    """Run fn on every case and compare it with `reference`; raise Failure at the first mismatch.

    cases: argument tuples; mistakes: [(diagnosis, candidate)], functions with fn's signature.
    describe(case) -> "prefix_len = 3 and k = 2"; read(out, case) turns the learner's output into
    a value (raising Failure where it has the wrong form); explain(case, got, want) -> the sentence
    that says what is wrong; on_error(exc) names the mistake an exception points to. Returns the
    number of cases checked."""
    fresh = lambda case: tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in case)  # noqa: E731
    got = [read(call(fn, fresh(case), describe(case), on_error), case) for case in cases]  # it may write in place
    want = [reference(*case) for case in cases]
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if not same(g, w)]
    if not bad:
        return len(cases)
    first = bad[0]
    diagnosis = match_mistake(got, cases, mistakes, same, first)
    raise Failure(explain(cases[first], got[first], want[first]), diagnosis)


def match_mistake(got, cases, mistakes, same, first):
    """The mistake whose candidate agrees with the learner on every case, else on case `first`.
    Several candidates may share a name (two ways to make one mistake)."""
    outputs = [(name, [safe(candidate, *case) for case in cases]) for name, candidate in mistakes]
    for name, outs in outputs:
        if all(o is not None and same(g, o) for g, o in zip(got, outs)):
            return name
    for name, outs in outputs:
        if outs[first] is not None and same(got[first], outs[first]):
            return name
    return None
