"""The EAGLE-3-style drafter opened up for chapter 10: what each drafted token's confidence was, and
two broken variants, each with one classic bug of a port.

- `ConfidenceDrafter`: Eagle3Drafter that also keeps q(d), the draft's probability of each token it
  drafted (its softmax at temperature 1, as EAGLE-2 reads confidence, Li et al., arXiv 2406.16858),
  one list per step that drafted, per answer (`answers`). The drafted tokens and the engine's
  verdicts are those of Eagle3Drafter: only the bookkeeping is added.
- `ConfidenceDrafter(..., feed_back="last_true")`: broken. While drafting, the entry after a drafted
  token reads the last state the target gave (the fused state of the last committed token) again,
  instead of the draft's own h for the token before it. The first drafted token of a step is the
  correct drafter's; the later ones read a state one or more positions stale.
- `reading_layers(draft, target, layers)`: broken. The same weights, fed the residual stream of
  other target layers than the ones they were trained on (a port that reads the wrong aux layers).
- `answer_examples`, `pick_layers` and `agreement_by_depth`: the target's answers as
  train/eagle3.py's examples (one target forward for several readings of its layers), and the
  draft's agreement with the target d tokens ahead of the last true state, teacher-forced (the
  true tokens fed, the draft's own states read d - 1 times): eagle3_loss's passes, with either
  feed-back.

Nothing else in the library imports this module.
"""
import torch

from ..core.sampling import draft_token
from ..drafters import Eagle3Draft, Eagle3Drafter
from ..train.eagle3 import UnrollKeys, subset_positions, unroll_mask
from ..train.feature import collate_entries

FEED_BACK = ("own", "last_true")


class ConfidenceDrafter(Eagle3Drafter):
    """Eagle3Drafter that logs q(d) of every drafted token. `answers[a][s][i]`: answer a (one per
    prefill), its s-th step that drafted, the i-th drafted token's q. `feed_back="own"` drafts as
    Eagle3Drafter does; "last_true" is the broken variant of the module docstring."""

    def __init__(self, model: Eagle3Draft, capacity, feed_back="own"):
        if feed_back not in FEED_BACK:
            raise ValueError(f"feed_back must be one of {FEED_BACK}, got {feed_back!r}")
        super().__init__(model, capacity)
        self.feed_back = feed_back
        self.answers = []

    def prefill(self, prompt_ids, hidden=None):
        self.answers.append([])  # a new answer starts
        super().prefill(prompt_ids, hidden)

    def propose(self, k, sampling, generator):
        """Eagle3Drafter's proposal (without its early stop), with each drafted token's q logged."""
        dev = self.model.device
        if len(self.pending_tokens) == 0:  # a one-token prompt: nothing to read yet
            return torch.empty(0, dtype=torch.long, device=dev), None
        tokens, feats = self.pending_tokens, self.pending_feats
        last_true = feats[-1]  # the fused state of the last committed token
        ids, qs, conf = [], [], []
        for i in range(k):
            h, logits = self.model(tokens.view(1, -1), torch.stack(feats)[None], cache=self.cache, last_only=True)
            h, logits = h[0, -1], logits[0, -1]
            d, q = draft_token(logits, sampling, generator)
            conf.append(torch.softmax(logits.float(), -1)[d])  # q(d) at temperature 1
            if not sampling.greedy:
                qs.append(q)
            ids.append(d)
            if i + 1 == k:
                break  # d_k is never fed
            tokens, feats = d.view(1), [h if self.feed_back == "own" else last_true]
        self.answers[-1].append(torch.stack(conf).tolist())  # one host read per step, for the log
        return torch.stack(ids), (torch.stack(qs) if qs else None)


def reading_layers(draft: Eagle3Draft, target, layers) -> Eagle3Draft:
    """A copy of `draft`'s weights that reads the target's residual stream after `layers` instead
    of after draft.hidden_layers (as many layers, so fc's shape fits)."""
    layers = tuple(layers)
    if len(layers) != len(draft.hidden_layers):
        raise ValueError(f"the draft's fc reads {len(draft.hidden_layers)} layers, got {len(layers)}: {layers}")
    twin = Eagle3Draft(target, layers, draft.head.ids.cpu(), norm_before_residual=draft.norm_before_residual)
    twin.load_state_dict(draft.state_dict())
    return twin.to(draft.dtype).eval().requires_grad_(False)


def confidence_table(results, drafter, edges=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0)):
    """Drafted tokens the target tested, binned by their q: [(low, high, tested, accepted, mean q)],
    from the GenerationResults of one engine over `drafter` (one result per prefill, in order). A
    token is tested when every drafted token before it in its step was accepted; the last bin
    holds q = high."""
    if len(results) != len(drafter.answers):
        raise ValueError(f"{len(results)} results for {len(drafter.answers)} logged answers: run each prompt once "
                         f"through one engine, with a fresh drafter")
    tested, accepted, q_sum = [0] * (len(edges) - 1), [0] * (len(edges) - 1), [0.0] * (len(edges) - 1)
    for res, log in zip(results, drafter.answers):
        steps = [s for s in res.steps if s.k > 0]
        if len(steps) != len(log) or any(len(q) != s.k for s, q in zip(steps, log)):
            raise ValueError("the log does not match the results' steps")
        for s, q in zip(steps, log):
            for i in range(min(s.num_accepted + 1, s.k)):  # tested: the accepted ones and the first rejected
                b = next(j for j in range(len(edges) - 1) if q[i] < edges[j + 1] or j == len(edges) - 2)
                tested[b] += 1
                accepted[b] += int(i < s.num_accepted)
                q_sum[b] += q[i]
    return [(edges[j], edges[j + 1], tested[j], accepted[j], q_sum[j] / tested[j] if tested[j] else None)
            for j in range(len(edges) - 1)]


@torch.no_grad()
def answer_examples(target, layers, prompts, answers, top_k=64):
    """The target over each prompt + answer (token id lists) in one padded forward: examples as
    train/feature.py's load_feature_shards gives them, (tokens (L,), the residual stream after
    `layers` (L - 1, n * dim) in float16, prompt length P, the target's top-k ids (L - P, k) and
    log-probabilities at the answer tokens)."""
    seqs = [list(p) + list(a) for p, a in zip(prompts, answers)]
    x = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long, device=target.device)
    for b, s in enumerate(seqs):  # right padding: causal attention keeps it out of the real rows
        x[b, :len(s)] = torch.tensor(s)
    final, states = target.hidden(x, layers=tuple(layers))
    out = []
    for b, (p, s) in enumerate(zip(prompts, seqs)):
        L, P = len(s), len(p)
        top = target.head(final[b, P - 1:L - 1]).float().log_softmax(-1).topk(top_k, -1)
        out.append((x[b, :L].cpu(), states[b, :L - 1].half().cpu(), P, top.indices.cpu(), top.values.cpu()))
    return out


def pick_layers(examples, layers, wanted):
    """answer_examples' examples over `layers`, cut down to the states of `wanted` (each in `layers`)."""
    layers, wanted = tuple(layers), tuple(wanted)
    missing = [i for i in wanted if i not in layers]
    if missing:
        raise ValueError(f"layers {missing} are not among the examples' layers {layers}")
    dim = examples[0][1].shape[-1] // len(layers)
    cols = torch.cat([torch.arange(layers.index(i) * dim, (layers.index(i) + 1) * dim) for i in wanted])
    return [(tok, states[:, cols], P, ids, lp) for tok, states, P, ids, lp in examples]


@torch.no_grad()
def guesses_by_depth(draft: Eagle3Draft, examples, depth=3, feed_back="own"):
    """[(guess, top) at depth 1..depth]: over the answer tokens of `examples` (answer_examples), the
    draft's top token and the target's, drafting d tokens ahead of the last true state. Pass s computes,
    for every entry at once, the entry drafted s steps after its base (the masks of train/eagle3.py).
    feed_back="own": the entry after a drafted one reads the draft's h (eagle3_loss's passes, as
    drafting does); "last_true": it reads the base's true state again."""
    if feed_back not in FEED_BACK:
        raise ValueError(f"feed_back must be one of {FEED_BACK}, got {feed_back!r}")
    tok, states, tgt_pos, _, weight = (t.to(draft.device) for t in collate_entries(
        examples, list(range(len(examples))), subset_positions(draft)))
    B, N = tok.shape
    g0 = draft.fuse_states(states)  # (B, N, dim): the true fused states
    g, keys, e, out = g0, UnrollKeys(draft.cfg.n_layers), torch.arange(N, device=tok.device), []
    for s in range(depth):
        h = draft.states(tok, g, cache=keys, input_pos=e, mask=unroll_mask(N, s, tok.device))
        keep = (weight > 0) & (torch.cat([weight.new_zeros(B, s), weight[:, :N - s]], 1) > 0)
        out.append((draft.head.proj(draft.norm(h[keep])).argmax(-1), tgt_pos[keep][:, 0]))
        if feed_back == "own":
            g = torch.cat([g[:, :1], h[:, :-1]], 1)  # entry e reads h of entry e - 1
        else:
            g = torch.cat([g0[:, :1]] * (s + 1) + [g0[:, :N - s - 1]], 1)  # entry e reads g of its base e - s - 1
    return out


def agreement_by_depth(draft: Eagle3Draft, examples, depth=3, feed_back="own"):
    """[agreement at depth 1..depth]: the share of the answer tokens where the draft's top token,
    drafting d tokens ahead of the last true state, is the target's (guesses_by_depth)."""
    return [((guess == top) & (top >= 0)).float().mean().item()
            for guess, top in guesses_by_depth(draft, examples, depth, feed_back)]


def guess_match(draft, reference, examples, layers, depth=3, feed_back="own"):
    """[share at depth 1..depth]: how often `draft` (fed its own layers from `examples`, read at `layers`)
    guesses the token that `reference`, the shipped draft drafting as vLLM and llama.cpp do, guesses."""
    mine = guesses_by_depth(draft, pick_layers(examples, layers, draft.hidden_layers), depth, feed_back)
    theirs = guesses_by_depth(reference, pick_layers(examples, layers, reference.hidden_layers), depth)
    return [(a == b).float().mean().item() for (a, _), (b, _) in zip(mine, theirs)]


def paired_gap(draft, examples, depth=3, feed_back="last_true", resamples=2000, seed=0):
    """[(gap, standard error) at depth 1..depth]: how much more often the draft agrees with the target fed
    back its own h than fed back `feed_back`, over the answer tokens of `examples`, and the gap's standard
    error when whole prompts are resampled, each with both of its figures (a paired bootstrap)."""
    counts = []  # per example: (hits with h, hits the other way, positions), one row per depth
    for e in examples:
        own, other = guesses_by_depth(draft, [e], depth), guesses_by_depth(draft, [e], depth, feed_back)
        counts.append([[float((g == t).sum()), float((o == t).sum()), float(len(t))]
                       for (g, t), (o, _) in zip(own, other)])
    counts = torch.tensor(counts)  # (examples, depth, 3)
    picks = torch.randint(0, len(examples), (resamples, len(examples)), generator=torch.Generator().manual_seed(seed))
    draws = counts[picks].sum(1)  # (resamples, depth, 3)
    total = counts.sum(0)
    return [((total[d, 0] - total[d, 1]) / total[d, 2]).item() for d in range(depth)], \
        ((draws[..., 0] - draws[..., 1]) / draws[..., 2]).std(0).tolist()


def rounded_port(draft: Eagle3Draft, target, dtype=torch.bfloat16) -> Eagle3Draft:
    """A copy of `draft` whose own weights were rounded to `dtype` and back: a correct port held at lower
    precision, as an engine on a GPU may hold it (the target's head it borrows is left as it is)."""
    twin = reading_layers(draft, target, draft.hidden_layers)
    own = set(twin.own_state_dict())
    with torch.no_grad():
        for name, value in twin.state_dict().items():
            if name in own and value.is_floating_point():
                value.copy_(value.to(dtype).to(value.dtype))
    return twin
