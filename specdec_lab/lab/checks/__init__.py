"""Each chapter's checks, out of its reading path.

A chapter ends with a recap and one short cell that calls its module here: `checks.<chapter>`.
Two kinds of check live in a module. A claim about the engine (greedy output equals the target's,
a masked pass equals single-token passes) is a function of the objects it checks, so the chapter
runs it on the correct piece and, through `must_fail`, on a broken variant from lab/pitfalls.py,
where it has to fail. A claim about the prose (a figure the chapter quotes) reads the stored run
the figure came from, or the chapter's own live results, passed in by name.

tests/test_checks_<chapter>.py run each module on the correct pieces and on the broken ones.
"""


def must_fail(check, broken, *args, name, **kwargs):
    """Run `check(broken, *args, **kwargs)`, which must raise AssertionError: a check that passes a
    broken variant checks nothing. Prints the failure and returns its message."""
    try:
        check(broken, *args, **kwargs)
    except AssertionError as failure:
        print(f"{name} fails the check, as it must: {failure}")
        return str(failure)
    raise AssertionError(f"the check did not catch {name}")


def take(ns, names):
    """The values of `names` (separated by spaces) in the namespace `ns`, in order."""
    return [ns[name] for name in names.split()]
