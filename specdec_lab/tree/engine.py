"""Speculative decoding with token trees: the chain engine's four steps, over a tree.

One step, with c the last committed token the target has not yet seen (docs/design.md,
"Token trees"):
  1. the draft proposes a tree rooted at c: a static shape, or grown EAGLE-2's way
     (draft.py), one draft forward per depth;
  2. the target runs ONE forward over [c, all nodes] with the tree mask, each node at
     position L + depth (structure.py) -> p at every node;
  3. a rule (rules.py) picks the accepted path and the token after it, on the device; the
     host reads the packed verdict in one synchronisation;
  4. the path's keys and values move to consecutive slots in the target's cache and the
     draft's (compact.py); the next token becomes the new c.

At temperature 0 the rule is "greedy" and the output equals the target's greedy decoding.
When sampling, a static tree uses Sequoia's rule over children drawn without replacement
("sampled") unless told otherwise, and a dynamic tree, whose children are the draft's top
ones, the "deterministic" rule; both are lossless.

The verification forward has an explicit mask; the CPU's one-call forward takes it as it takes
the chain's (cpu/fused.py, `from_mask`): each node attends over the cache and its ancestors, bit
for bit as its path fed as a chain would (tests/test_fused_shapes.py).
"""
import time
from dataclasses import dataclass

import torch

from ..core.config import SamplingConfig
from ..core.engine import (Engine, GenerationResult, _decode, check_capacity, check_generate_args, check_seed,
                           check_token_ids, cut_at_eos)
from ..core.kv_cache import KVCache
from ..core.model import Transformer
from ..core.records import RunStats, StepRecord
from ..core.sampling import logits_to_probs, make_generator
from ..core.text import encode_prompt
from ..drafters.model import ModelDrafter
from ..paged import PagedSequenceCache
from .auto import choose
from .compact import compact
from .draft import DynamicTree, TreeDrafter
from .rules import RULES, tree_draws, verify_tree
from .structure import check_tree_shape, positions, tree_mask, tree_size


def check_tree_option(tree):
    """A static shape (a tuple of branching factors) or a DynamicTree ("auto" is resolved before this)."""
    if isinstance(tree, DynamicTree):
        return tree
    if isinstance(tree, tuple):
        check_tree_shape(tree)
        return tree
    raise ValueError(f"tree must be a tuple of branching factors such as (4, 2, 1), a DynamicTree or 'auto', "
                     f"got {tree!r}")


def cache_factory(kind, block_size):
    """(cfg, capacity, dtype=, device=) -> an empty contiguous or paged cache (as api.cache_factory)."""
    if kind not in ("contiguous", "paged"):
        raise ValueError(f"cache must be 'contiguous' or 'paged', got {kind!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    if kind == "contiguous":
        return KVCache.for_model
    return lambda cfg, cap, **kw: PagedSequenceCache.for_model(cfg, cap, block_size=block_size, **kw)


def nodes_of(tree) -> int:
    """Nodes of a tree option, the root included."""
    return tree.budget + 1 if isinstance(tree, DynamicTree) else tree_size(tree)


def lookahead(tree) -> int:
    """Positions one step may take past the committed tokens: every node in the target's cache; in
    the draft's, its pending tokens (at most 2) and every node it feeds (a dynamic tree feeds top_k
    per depth above the last, a static one every level above the deepest), plus the next token."""
    if isinstance(tree, DynamicTree):
        fed = tree.top_k * (tree.depth - 1)
    else:
        fed = tree_size(tree[:-1]) - 1
    return max(nodes_of(tree), fed + 2) + 1


@dataclass
class TreeStep:
    """One step's tree as the host read it: node 0 is the root (the pending token x_0)."""
    tokens: list  # token of each node
    parents: list  # parent of each node, -1 for the root
    path: list  # the accepted path's nodes from the root, [0, ...]
    next_token: int  # the target's token after the path (its correction or bonus)


class TreeEngine:
    """Speculative decoding over token trees with a draft model.

    engine = TreeEngine(target, draft, tree=(4, 2, 1)); engine.generate(prompt, max_new_tokens=64)
    `tree`: a static shape, a DynamicTree(depth, top_k, budget), or "auto": measure the draft's acceptance
    by rank on `auto_prompts` at `auto_temperature` and both models' costs by row count here, and run the
    shape of the most tokens per second predicted (auto.py), or the chain engine where no tree pays;
    `self.plan` holds the choice, `self.acceptance` and `self.costs` what it was made from. `rule` (when sampling): None picks "sampled" for a static tree and
    "deterministic" for a dynamic or automatic one; "typical" is Medusa's lossy rule.
    `keep_trees = True` keeps each step's tree in `self.trees` (a TreeStep: its tokens, parents and accepted
    path, read in the step's one host read), for drawing one (lab/tree_draw.py).
    """
    keep_trees = False

    def __init__(self, target, draft, tree=(4, 2, 1), rule=None, max_seq_len=2048, tokenizer=None,
                 auto_prompts=None, auto_temperature=0.0, auto_max_nodes=32, cache="contiguous", block_size=16):
        for name, m in (("target", target), ("draft", draft)):
            if not isinstance(m, Transformer):
                raise TypeError(f"{name} must be a specdec_lab Transformer, got {type(m).__name__}")
        if draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                             f"({target.cfg.vocab_size}); the draft must share the target's tokenizer")
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 2:
            raise ValueError(f"max_seq_len must be an int >= 2, got {max_seq_len!r}")
        self.tokenizer = tokenizer or getattr(target, "tokenizer", None)
        self.plan, self.acceptance, self.costs, self.chain = None, None, None, None
        if tree == "auto":
            if not auto_prompts or isinstance(auto_prompts, str):
                raise ValueError(f"tree='auto' needs auto_prompts, a non-empty list of prompts, got {auto_prompts!r}")
            self.plan, self.acceptance, self.costs = choose(target, draft, auto_prompts, auto_temperature,
                                                            max_nodes=auto_max_nodes, tokenizer=self.tokenizer)
            tree, rule = self.plan.shape, rule or "deterministic"  # the acceptance measured is the top-b rule's
        self.tree = check_tree_option(tree)
        self.rule = self._check_rule(rule, self.tree)
        capacity = min(max_seq_len, target.cfg.max_seq_len)
        self.limits = {"the cache capacity (max_seq_len)": capacity, "the target's positions": target.cfg.max_seq_len,
                       "the draft's positions": draft.cfg.max_seq_len}
        if lookahead(self.tree) >= min(self.limits.values()):
            raise ValueError(f"tree {self.tree!r} takes up to {lookahead(self.tree)} positions a step, more than "
                             f"{min(self.limits, key=self.limits.get)} ({min(self.limits.values())})")
        factory = cache_factory(cache, block_size)
        self.target = target
        self.cache = factory(target.cfg, capacity, dtype=target.dtype, device=target.device)
        self.drafter = TreeDrafter(draft, capacity, factory)
        self.max_seq_len = min(self.limits.values())
        if self.plan is not None and self.plan.chain:  # no tree pays here: the chain engine, fused verification
            self.chain = Engine(target, ModelDrafter(draft, capacity, factory), k=len(self.plan.shape),
                                cache=self.cache, tokenizer=self.tokenizer)

    @staticmethod
    def _check_rule(rule, tree):
        if rule is None:
            return "deterministic" if isinstance(tree, DynamicTree) else "sampled"
        if rule not in RULES or rule == "greedy":
            raise ValueError(f"rule must be None, 'deterministic', 'sampled' or 'typical' (temperature 0 is always "
                             f"greedy), got {rule!r}")
        if rule == "sampled" and isinstance(tree, DynamicTree):
            raise ValueError("rule 'sampled' needs children drawn from q: a static tree, not a DynamicTree")
        return rule

    @torch.inference_mode()
    def generate(self, prompt, max_new_tokens=128, temperature=0.0, top_p=1.0, seed=None, top_k=0,
                 on_step=None) -> GenerationResult:
        if self.chain is not None:
            return self.chain.generate(prompt, max_new_tokens, temperature, top_p, seed, top_k, on_step=on_step)
        ids = encode_prompt(self.tokenizer, prompt)
        check_generate_args(max_new_tokens, temperature, top_p, top_k)
        check_seed(seed)
        check_capacity(len(ids), max_new_tokens, lookahead(self.tree), self.limits)
        check_token_ids(ids, self.target.cfg.vocab_size)
        sampling = SamplingConfig(temperature, top_k, top_p)
        device, eos = self.target.device, self.target.cfg.eos_token_ids
        g = make_generator(seed, device)
        stats, steps, out = RunStats(), [], []
        self.trees = []
        t0 = time.perf_counter()
        self.cache.reset()
        prompt_t = torch.tensor(ids, device=device)  # the prompt's one copy to the device
        if len(ids) > 1:  # the prompt but its last token, which the first step feeds as c
            self.target(prompt_t[:-1].view(1, -1), cache=self.cache, last_only=True)
        self.drafter.prefill(ids)
        stats.prefill_seconds = time.perf_counter() - t0
        c, t_start = prompt_t[-1:], time.perf_counter()
        while len(out) < max_new_tokens:
            rec, c = self._step(c, sampling, g, len(steps))
            rec.committed = cut_at_eos(rec.drafted[:rec.num_accepted] + [rec.next_token], max_new_tokens - len(out), eos)
            out += rec.committed
            steps.append(rec)
            stats.add_step(rec, len(rec.committed))
            if on_step is not None:
                on_step(rec, out)
            if rec.committed[-1] in eos:
                break
        stats.seconds = time.perf_counter() - t_start
        return GenerationResult(out, _decode(self.tokenizer, out), steps, stats, ids)

    def _draft(self, sampling, g):
        rule = "greedy" if sampling.greedy else self.rule
        if isinstance(self.tree, DynamicTree):
            return self.drafter.draft_dynamic(self.tree, sampling, g), rule, self.tree.top_k
        tree = self.drafter.draft_static(self.tree, sampling, g, sampled=rule == "sampled", keep_q=rule == "sampled")
        return tree, rule, max(self.tree)

    def _step(self, c, sampling, g, step_index):
        """One step from c (1,) on the device: its record and the next c (1,) on the device."""
        t0 = time.perf_counter()
        # 1. The draft proposes a tree rooted at c (the drafter's last pending token).
        tree, rule, width = self._draft(sampling, g)
        t1 = time.perf_counter()
        # 2. One target forward over [c, all nodes] with the tree mask, positions by depth.
        L = self.cache.length
        logits = self.target(tree.tokens.view(1, -1), input_pos=positions(tree, L), cache=self.cache,
                             mask=tree_mask(tree, L, self.target.dtype))[0]  # (N, V)
        # 3. The rule decides on the device; the host reads the packed verdict once.
        p = logits if sampling.greedy else logits_to_probs(logits, sampling.temperature, sampling.top_k,
                                                           sampling.top_p)
        u, w = (None, None) if sampling.greedy else tree_draws(tree.size, width, g, logits.device)
        verdict = verify_tree(tree, p, rule, u, w, width)  # [m, next, N, path..., tokens...]
        D = tree.max_depth
        path = verdict[3:4 + D]
        last_fed = tree.slot.index_select(0, path.index_select(0, verdict[:1])) >= 0  # (1,)
        shape = [tree.parents[1:]] if self.keep_trees else []  # read with the rest: no sync of its own
        host = torch.cat([verdict, last_fed.long(), tree.tokens[1:], *shape]).tolist()  # sync: the one per step
        m, next_token = host[0], host[1]
        nodes = host[6 + 2 * D:6 + 2 * D + tree.size - 1]  # [verdict, last_fed, node tokens, (parents)]
        if self.keep_trees:
            self.trees.append(TreeStep([host[4 + D]] + nodes, [-1] + host[5 + 2 * D + tree.size:],
                                       [0] + host[4:4 + m], next_token))
        on_path = set(host[4:4 + m])  # the accepted path's nodes below the root
        drafted = host[4 + D + 1:4 + D + 1 + m] + [t for i, t in enumerate(nodes, 1) if i not in on_path]
        # 4. Compact: the path's keys and values follow c's; the drafter keeps its own path; next is c.
        compact(self.cache, path[1:m + 1] + L, L + 1)
        nxt = verdict[1:2]
        self.drafter.commit(tree, path, m, bool(host[5 + 2 * D]), nxt)
        return StepRecord(step=step_index, k=tree.size - 1, drafted=drafted, num_accepted=m, next_token=next_token,
                          p_draft=[], q_draft=[], uniforms=[], draft_seconds=t1 - t0,
                          target_seconds=time.perf_counter() - t1, syncs=1), nxt
