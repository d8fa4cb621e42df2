"""The systems a benchmark run times: this engine autoregressive, speculative at each K, adaptive K,
the drafting refinements, the feature draft, the self-draft, and transformers' own generation."""
from dataclasses import dataclass, field

from ..api import LookupThenModelDrafter, SpeculativeEngine, autoregressive_generate
from ..cpu import QuantizedDecoding, SelfDraft
from ..drafters import Eagle3Draft, Eagle3Drafter, FeatureDrafter, ModelDrafter
from ..io.weights import hf_generate
from ..policies.adaptive import CostAwareController


@dataclass
class Tally:
    """What one system did over the prompts of one temperature."""
    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0  # wall time of the calls, prefill included
    decode_seconds: float = 0.0  # the engine's decode loop only (own systems)
    prompt_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # drafting steps that ended in a rejection
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    syncs: int = 0
    outputs: list = field(default_factory=list)  # the new ids of each call, prompt order
    call_seconds: list = field(default_factory=list)  # the wall time of each call, prompt order
    call_steps: list = field(default_factory=list)  # the steps of each call (own systems)
    call_prompts: list = field(default_factory=list)  # which prompt each call ran (several calls when sampling)

    def add(self, ids, tokens, seconds, stats=None, steps=(), prompt=None):
        self.call_prompts.append(self.calls if prompt is None else prompt)
        self.calls += 1
        self.tokens += len(tokens)
        self.seconds += seconds
        self.prompt_tokens += len(ids)
        self.outputs.append(tokens)
        self.call_seconds.append(seconds)
        if stats is None:
            return
        self.call_steps.append(stats.steps)
        self.decode_seconds += stats.seconds
        self.steps += stats.steps
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.rejections += sum(1 for s in steps if 0 < s.k and s.num_accepted < s.k)
        self.draft_seconds += stats.draft_seconds
        self.target_seconds += stats.target_seconds
        self.syncs += stats.syncs

    def per_prompt(self) -> tuple[list, list, list]:
        """(prompts, tokens, seconds): each prompt's calls summed, in order of first appearance."""
        tokens, seconds = {}, {}
        for p, new, sec in zip(self.call_prompts, self.outputs, self.call_seconds):
            tokens[p] = tokens.get(p, 0) + len(new)
            seconds[p] = seconds.get(p, 0.0) + sec
        return list(tokens), list(tokens.values()), list(seconds.values())


@dataclass
class System:
    name: str  # the JSON key
    label: str  # the table's row
    run: object  # (ids, max_new_tokens, temperature, seed) -> (new ids, GenerationResult or None)
    k: int | None = None  # fixed draft length, None for adaptive or no drafting
    own: bool = True  # this engine (has step statistics) or transformers
    drafts: bool = False
    k_max: int | None = None  # a ceiling on K that the drafter may stop short of (no prediction then)
    theorem: bool = True  # Theorem 3.8 with the shipped draft's alpha and c applies (not to the feature draft)


# The two drafting refinements the bench runs beside fixed and adaptive K (drafters/): the
# draft stops after a token it gave less than STOP_BELOW, with K = STOP_K as a ceiling; and
# where the context's last 2-4 tokens occurred before, prompt lookup proposes the STOP_K tokens
# that followed them, the stopping draft proposing everywhere else.
STOP_K, STOP_BELOW = 6, 0.2

# The feature draft (drafters/feature.py, EAGLE) runs at these fixed K, with early stopping under
# FEATURE_STOP_K as a ceiling, and behind prompt lookup at FEATURE_LOOKUP_K without the stop: a
# feature draft token costs more than the shipped draft's, and in a side-by-side run on 12 prompts
# the stop at 0.2 with a ceiling of 6 lost to K = 4 (1.47x against 1.56x the autoregressive decode).
# Its acceptance falls with depth (each drafted token reads the draft's own estimate of the state
# before it), so Theorem 3.8's one alpha does not describe it.
FEATURE_KS, FEATURE_STOP_K, FEATURE_LOOKUP_K = (3, 4, 5), 8, 4

# The target's own weights as its draft (cpu/self_draft.py), in 4 bits where the kernels allow, else in
# int8: it agrees with the target far more often than a distilled draft and costs a fifth (4 bits) to a
# quarter (int8) of a target forward, so longer drafts pay.
# K = 7 verifies 8 rows, the most the panel kernel takes in one pass over the weights (its RB);
# K = 8's 9 rows need a second pass.
SELF_KS = (4, 6, 7, 8)
# The same draft behind prompt lookup (SelfDraft(lookup=True)): where the context repeats, k copied
# tokens cost no self-draft forward, and each such forward costs a fifth to a quarter of the target's.
SELF_LOOKUP_K = 6


def make_systems(target, draft, ks, adaptive=True, hf_target=None, hf_draft=None, fixed_c=None,
                 verify_cost=None, refinements=True, feature_draft=None, self_draft=None) -> list:
    """The systems in their table order. `fixed_c` pins the adaptive controller's c (CUDA);
    `verify_cost` ({K: cost of a K+1-token forward over a one-token one}) is what it assumes
    a verification costs. `refinements` adds the early-stopping draft and lookup + draft;
    `feature_draft` (a feature_draft.FeatureDraft) its systems at FEATURE_KS and with early stopping;
    `self_draft` (a self_draft.SelfDraft) the target drafting for itself at SELF_KS, and behind prompt
    lookup at SELF_LOOKUP_K."""
    eos = target.cfg.eos_token_ids

    def ar(ids, n, temperature, seed):
        res = autoregressive_generate(target, ids, max_new_tokens=n, temperature=temperature, seed=seed)
        return res.tokens, res

    systems = [System("ar", "this engine, autoregressive", ar)]
    engine = SpeculativeEngine(target, draft, k=1)
    for k in ks:
        def spec(ids, n, temperature, seed, k=k):
            res = engine.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed, k=k)
            return res.tokens, res
        systems.append(System(f"spec_k{k}", f"speculative, K={k}", spec, k=k, drafts=True))
    if adaptive:
        engine_a = SpeculativeEngine(target, draft, k=4)
        engine_a.controller = CostAwareController(c=fixed_c, verify_cost=verify_cost)

        def spec_adaptive(ids, n, temperature, seed):
            res = engine_a.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed)
            return res.tokens, res
        systems.append(System("spec_adaptive", "speculative, adaptive K", spec_adaptive, drafts=True))
    if refinements:
        capacity = min(2048, target.cfg.max_seq_len, draft.cfg.max_seq_len)
        for name, label, drafter in (
                ("spec_stop", f"spec, K<={STOP_K}, stop at q<{STOP_BELOW:g}",
                 ModelDrafter(draft, capacity, stop_below=STOP_BELOW)),
                ("spec_lookup", "spec, prompt lookup + stop",
                 LookupThenModelDrafter(draft, capacity, stop_below=STOP_BELOW))):
            engine_r = SpeculativeEngine(target, drafter, k=STOP_K)

            def spec_refined(ids, n, temperature, seed, engine_r=engine_r):
                res = engine_r.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed)
                return res.tokens, res
            systems.append(System(name, label, spec_refined, drafts=True, k_max=STOP_K))
    if feature_draft is not None:
        capacity = min(2048, target.cfg.max_seq_len)
        drafter_of = Eagle3Drafter if isinstance(feature_draft, Eagle3Draft) else FeatureDrafter
        feature = [(f"spec_feat_k{k}", f"feature draft, K={k}", drafter_of(feature_draft, capacity), k, None)
                   for k in FEATURE_KS]
        feature.append(("spec_feat_stop", f"feature, K<={FEATURE_STOP_K}, stop at q<{STOP_BELOW:g}",
                        drafter_of(feature_draft, capacity, stop_below=STOP_BELOW), FEATURE_STOP_K,
                        FEATURE_STOP_K))
        feature.append(("spec_feat_lookup", f"feature draft, lookup + K={FEATURE_LOOKUP_K}",
                        LookupThenModelDrafter(feature_draft, capacity), FEATURE_LOOKUP_K, FEATURE_LOOKUP_K))
        for name, label, drafter, k, k_max in feature:
            engine_f = SpeculativeEngine(target, drafter, k=k)

            def spec_feature(ids, n, temperature, seed, engine_f=engine_f):
                res = engine_f.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed)
                return res.tokens, res
            systems.append(System(name, label, spec_feature, k=k, drafts=True, k_max=k_max, theorem=False))
    if self_draft is not None:
        engine_s = SpeculativeEngine(target, self_draft, k=1)
        for k in SELF_KS:
            def spec_self(ids, n, temperature, seed, k=k):
                res = engine_s.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed, k=k)
                return res.tokens, res
            systems.append(System(f"spec_self_k{k}", f"self-draft {self_draft.weights}, K={k}", spec_self, k=k,
                                  drafts=True, theorem=False))
        engine_sl = SpeculativeEngine(target, SelfDraft(target, self_draft.weights, lookup=True), k=SELF_LOOKUP_K)

        def spec_self_lookup(ids, n, temperature, seed):
            res = engine_sl.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed)
            return res.tokens, res
        systems.append(System("spec_self_lookup", f"self-draft {self_draft.weights}, lookup + K={SELF_LOOKUP_K}",
                              spec_self_lookup, drafts=True, k_max=SELF_LOOKUP_K, theorem=False))
        # The same rounded weights decoding alone, nothing verified: faster, but another model's output
        quantized = QuantizedDecoding(self_draft)

        def rounded(ids, n, temperature, seed):
            res = autoregressive_generate(quantized, ids, max_new_tokens=n, temperature=temperature, seed=seed)
            return res.tokens, res
        systems.append(System(f"{self_draft.weights}_decode", f"{self_draft.weights} decode alone, unverified",
                              rounded))
    if hf_target is not None:

        def hf(ids, n, temperature, seed):
            return hf_generate(hf_target, ids, n, temperature=temperature, seed=seed, eos_token_ids=eos), None
        systems.append(System("hf_generate", "transformers generate", hf, own=False))
        if hf_draft is not None:
            def hf_assisted(ids, n, temperature, seed):
                return hf_generate(hf_target, ids, n, assistant=hf_draft, temperature=temperature, seed=seed,
                                   eos_token_ids=eos), None
            systems.append(System("hf_assisted", "transformers assisted", hf_assisted, own=False, drafts=True))
    return systems
