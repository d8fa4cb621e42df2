"""Chapter 08's checks: the metrics a scraper reads are the engine's own count, every metric is exported and
served on loopback only, and prompt lookup is lossless and pays where the answer copies its prompt.

`lookup_lossless` is a claim about an engine, so the chapter runs it on its prompt-lookup engine and, through
`must_fail`, on `pitfalls.off_by_one_rollback_engine` with the same drafter, whose target cache keeps one
position too few after each step. The other functions check the chapter's own results, passed in by name.
"""
from prometheus_client.parser import text_string_to_metric_families

from ...core.engine import autoregressive_generate


def scrape_matches_stats(checks, stats):
    """Every scraped counter equals the engine's `RunStats` (`checks`: name -> (scraped, RunStats), the
    chapter's twelve rows), the accepted count per position never rises with the position, and the default
    path syncs with the host once per step."""
    for name, (got, want) in checks.items():
        assert got == want, f"scraped {name} ({got}) must equal the engine's RunStats ({want})"
    assert len(checks) == 12 and list(stats.accepted_per_position) == sorted(stats.accepted_per_position, reverse=True)
    assert stats.syncs == stats.steps, "the engine's default path syncs with the host once per step"


def every_metric_exported(exposed, made, missing, families, demo_scrape):
    """All 11 metrics the exporter makes are registered and exported (`exposed`: the registry's names,
    `made`: attribute -> metric family, `families`: the scrape's), and the demonstration's unregistered
    counter never reaches its scrape `demo_scrape`."""
    assert all(family.name in exposed for family in made.values()), "every metric the exporter makes must be registered"
    assert "specdec_tokens_drafted" in exposed, "the drafted-tokens counter must be exported"
    assert "demo_tokens_drafted" not in demo_scrape, "a counter that is never registered never reaches a scrape"
    assert not missing and len(made) == len(families) == 11, (made, families)
    assert [f.name for f in text_string_to_metric_families(demo_scrape)
            if not f.name.endswith("_created")] == ["demo_tokens_accepted"], demo_scrape


def served_on_loopback(scraped, exposition, host, still_serving):
    """The HTTP scrape returns the exporter's exposition, the server binds loopback and stops at shutdown."""
    assert scraped == exposition, "an HTTP scrape must return the exporter's exposition"
    assert host == "127.0.0.1" and not still_serving, "metrics bind loopback and stop at shutdown"


def lookup_lossless(engine, target, workload):
    """The engine, run greedy on each (name, prompt, max_new_tokens) of `workload`, gives the target's own
    greedy tokens: prompt lookup never changes the output, only how many tokens a step commits."""
    for name, prompt, n in workload:
        baseline = autoregressive_generate(target, prompt, max_new_tokens=n, temperature=0.0)
        res = engine.generate(prompt, max_new_tokens=n, temperature=0.0, seed=0)
        assert res.tokens == baseline.tokens, f"prompt lookup changed the greedy output ({name})"


def lookup_figures(ngram):
    """Prompt lookup's table (`ngram`: the workload's name -> result): more than 1.5 tokens per target forward
    on the copy task, more than on chat, where lookup never lands and every step commits one token."""
    copy_tps = ngram["copy"].stats.mean_tokens_per_step
    assert copy_tps > 1.5, f"prompt lookup must commit > 1.5 tokens per step when copying, got {copy_tps:.2f}"
    assert copy_tps > ngram["chat"].stats.mean_tokens_per_step, "copying must give lookup more to find than chat"
    assert ngram["chat"].stats.mean_tokens_per_step == 1.0 and ngram["chat"].stats.accepted == 0, \
        "chat: lookup never lands"
