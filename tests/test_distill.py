"""The distillation code on a tiny target: data, loss, and a held-out alpha that rises."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab.train.data import ShardData, generate_data, load_shards
from specdec_lab.train.distill import distill_main, draft_config, grow_draft, held_out_agreement, is_held_out, kl_loss, layers_of, load_draft_weights, save_draft, train_draft
from specdec_lab.core.model import Transformer, init_weights


def _tiny_target():
    return sl.tiny_model(0, vocab_size=48, dim=32, n_heads=4, n_kv_heads=2, eos_token_ids=(47,))


def _bigram_target():
    """A tiny target whose attention output is zeroed: its next token depends on the current one
    only, a function a one-layer draft can learn in a few hundred steps."""
    t = _tiny_target()
    with torch.no_grad():
        for block in t.layers:
            block.attn.wo.weight.zero_()
    return t


def test_batched_answers_equal_single_prompt_greedy_answers(tmp_path):
    target = _tiny_target()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]
    generate_data(target, None, tmp_path, rounds=(0.0,), batch_size=3, max_new_tokens=12, prompts=prompts,
                  progress=False)
    train, _ = load_shards(tmp_path, held_out=set())
    for prompt_ids, answer, top_ids, top_lp, temp in train:
        expect = sl.autoregressive_generate(target, prompt_ids.tolist(), max_new_tokens=12).tokens
        assert answer.tolist() == expect, "left padding changed the target's answers"
        assert top_ids.shape == (len(answer), 48) or top_ids.shape[0] == len(answer)
        assert torch.equal(top_ids[:, 0], answer), "greedy answers must be the stored top-1"


def test_kl_loss_is_zero_when_the_draft_matches_the_stored_distribution():
    logits = torch.randn(1, 4, 10)
    top = logits.log_softmax(-1).topk(10, dim=-1)
    weight = torch.ones(1, 4)
    assert kl_loss(logits, top.indices, top.values, weight).abs() < 1e-5
    assert kl_loss(torch.randn(1, 4, 10), top.indices, top.values, weight) > 0.01


def test_training_a_tiny_draft_raises_held_out_alpha(tmp_path):
    torch.manual_seed(0)
    target = _bigram_target()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 40, (int(n),), generator=g).tolist() for n in torch.randint(2, 8, (60,), generator=g)]
    generate_data(target, None, tmp_path / "data", rounds=(1.0, 0.0), batch_size=20, max_new_tokens=24,
                  prompts=prompts, top_k_store=16, progress=False)
    held_idx = set(range(50, 60))
    train, held = load_shards(tmp_path / "data", held_idx)
    held = [ex for ex in held if ex[4] == 0.0]
    draft = init_weights(Transformer(draft_config(target.cfg, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                                  intermediate_size=64)), seed=1)
    before = held_out_agreement(draft, held)
    draft, curve = train_draft(draft, train, held, out_dir=tmp_path, epochs=10, lr=1e-2, max_tokens=512,
                               eval_every=20, progress=False)
    after = held_out_agreement(draft, held)
    assert after > before + 0.15, f"held-out alpha did not rise: {before:.3f} -> {after:.3f}"
    assert curve and curve[-1][1] == after


def test_shard_data_picks_up_shards_written_after_it_was_made(tmp_path):
    target = _tiny_target()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8], [9, 10]]
    generate_data(target, None, tmp_path, rounds=(0.0,), batch_size=2, max_new_tokens=6, prompts=prompts[:2],
                  progress=False)
    data = ShardData([tmp_path], held_idx={1})
    assert len(data.train()) == 1 and len(data.split()[1]) == 1
    (tmp_path / "round0_0001.pt.partial").write_bytes(b"half-written")  # never read
    generate_data(target, None, tmp_path / "more", rounds=(0.0,), batch_size=2, max_new_tokens=6,
                  prompts=prompts[2:], progress=False)
    (tmp_path / "more" / "round0_0000.pt").rename(tmp_path / "round0_0001.pt")
    train, held = data.split()
    assert len(train) + len(held) == 4, "a shard that lands between epochs must join the training data"


def test_a_warm_start_continues_the_weights_and_the_curve(tmp_path):
    torch.manual_seed(0)
    target = _bigram_target()
    prompts = [[i % 40, (3 * i) % 40, (7 * i) % 40] for i in range(30)]
    generate_data(target, None, tmp_path / "data", rounds=(0.0,), batch_size=10, max_new_tokens=16,
                  prompts=prompts, top_k_store=16, progress=False)
    train, held = load_shards(tmp_path / "data", set(range(25, 30)))
    cfg = draft_config(target.cfg, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=64)
    first, curve1 = train_draft(init_weights(Transformer(cfg), seed=1), train, held, out_dir=tmp_path / "p1",
                                epochs=4, lr=1e-2, max_tokens=256, eval_every=5, progress=False)
    second = init_weights(Transformer(cfg), seed=7)
    history = load_draft_weights(second, tmp_path / "p1" / "ckpt.pt")
    x = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(second.eval()(x), first(x)), "the warm start must load the checkpoint's weights"
    _, curve2 = train_draft(second, train, held, out_dir=tmp_path / "p2", total_steps=5, lr=1e-3,
                            max_tokens=256, eval_every=5, progress=False, history=history)
    assert curve2[:len(curve1)] == curve1 and len(curve2) == len(curve1) + 1
    assert curve2[-1][0] > curve1[-1][0], "answer tokens seen keep counting from the first phase"


def test_saved_draft_loads_in_the_project_decoder_with_the_same_logits(tmp_path):
    target = _tiny_target()
    draft = init_weights(Transformer(draft_config(target.cfg, dim=32, n_layers=2, n_heads=2, n_kv_heads=1,
                                                  intermediate_size=64)), seed=2)
    out = save_draft(draft, tmp_path / "d", dtype=torch.float32)
    (out / "tokenizer_config.json").write_text("{}")  # a tiny model has no tokenizer; load_model wants one
    from safetensors.torch import load_file
    from specdec_lab.io.weights import build_model, config_from_hf, from_hf_state_dict
    import json
    cfg = config_from_hf(json.loads((out / "config.json").read_text()))
    loaded = build_model(cfg, from_hf_state_dict(load_file(str(out / "model.safetensors")), cfg))
    x = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(loaded(x), draft.eval()(x), atol=1e-5)


def test_distill_command_tiny_budget_runs_end_to_end(tmp_path):
    """`python -m specdec_lab distill --budget tiny`: real target answers, training, a loadable draft."""
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = tmp_path / "draft"
    proc = subprocess.run([sys.executable, "-m", "specdec_lab", "distill", "--budget", "tiny", "--out", str(out),
                           "--data-dir", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work")], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == 49152 and (out / "README.md").exists()
    assert (out / "model.safetensors").stat().st_size < 30e6
    subset = json.loads((out / "vocab_subset.json").read_text())
    assert 2 in subset["ids"] and 0 < len(subset["ids"]) <= 8193 and 0 < subset["coverage"] <= 1
    from specdec_lab.io.assets import ensure_default_target
    pair = sl.load_pair(ensure_default_target(), out)
    assert pair.draft.head.weight.shape[1] == len(subset["ids"]), "the folder's subset must reach the loaded draft"
    grown = tmp_path / "grown"  # a second phase that grows the draft by one block
    proc = subprocess.run([sys.executable, "-m", "specdec_lab", "distill", "--budget", "tiny", "--out", str(grown),
                           "--data-dir", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work2"),
                           "--init-from", str(out), "--layers", "2", "--steps", "2"], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert layers_of(out) == cfg["num_hidden_layers"] == 1 and layers_of(grown) == 2
    assert layers_of(tmp_path / "work2" / "ckpt.pt") == 2


def test_held_out_may_be_a_predicate_and_splits_like_a_set(tmp_path):
    target = _tiny_target()
    prompts = [[i + 1, i + 2] for i in range(12)]
    generate_data(target, None, tmp_path, rounds=(0.0,), batch_size=4, max_new_tokens=4, prompts=prompts,
                  progress=False)
    by_set = load_shards(tmp_path, {9})
    by_rule = load_shards(tmp_path, is_held_out)
    assert [len(x) for x in by_set] == [len(x) for x in by_rule] == [11, 1]
    assert torch.equal(by_set[1][0][0], by_rule[1][0][0]) and by_rule[1][0][0].tolist() == [10, 11]


def test_task_prompts_are_fixed_distinct_and_share_nothing_with_the_benchmark():
    from specdec_lab.train.prompts import BENCH_PROMPTS, distill_prompts, task_prompts
    tasks = task_prompts()
    assert tasks == task_prompts(), "the set must be the same on every call: shards are indexed by position"
    assert len(tasks) == len(set(tasks)) > 600
    assert not set(tasks) & set(BENCH_PROMPTS), "a benchmark prompt in the training data would inflate its alpha"
    assert not set(tasks) & set(distill_prompts())
    kinds = {"Summarize": 0, "function that": 0, "list": 0, "?": 0}
    for p in tasks:
        for k in kinds:
            kinds[k] += k in p
    assert min(kinds.values()) >= 40, kinds


def test_chat_prompts_are_fixed_distinct_and_new():
    from specdec_lab.train.prompts import BENCH_PROMPTS, chat_prompts, distill_prompts, task_prompts
    chats = chat_prompts()
    assert chats == chat_prompts(), "the set must be the same on every call: shards are indexed by position"
    assert len(chats) == len(set(chats)) > 300
    assert not set(chats) & (set(BENCH_PROMPTS) | set(task_prompts()) | set(distill_prompts()))


def test_a_grown_draft_computes_the_same_function_and_its_new_blocks_learn(tmp_path):
    torch.manual_seed(0)
    target = _bigram_target()
    cfg = draft_config(target.cfg, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, intermediate_size=64)
    draft = init_weights(Transformer(cfg), seed=1).eval()
    x = torch.tensor([[1, 2, 3, 4, 5]])
    for n in (2, 3, 5):
        grown = grow_draft(draft, n).eval()
        assert grown.cfg.n_layers == n and torch.allclose(grown(x), draft(x), atol=1e-5)
    grown = grow_draft(draft, 4)  # one new block after each old one: old, new, old, new
    for slot, old in ((0, 0), (2, 1)):
        assert torch.equal(grown.layers[slot].attn.wqkv.weight, draft.layers[old].attn.wqkv.weight)
    for slot in (1, 3):
        assert not grown.layers[slot].attn.wo.weight.any() and not grown.layers[slot].mlp.w2.weight.any()
    with pytest.raises(ValueError, match="n_layers"):
        grow_draft(draft, 1)
    with pytest.raises(ValueError, match="n_layers"):
        distill_main(budget="tiny", work_dir=tmp_path / "never", n_layers=0)
    assert not (tmp_path / "never").exists(), "a bad n_layers must fail before anything is written"
    prompts = [[i % 40, (3 * i) % 40] for i in range(20)]
    generate_data(target, None, tmp_path / "data", rounds=(0.0,), batch_size=10, max_new_tokens=8,
                  prompts=prompts, top_k_store=16, progress=False)
    train, held = load_shards(tmp_path / "data", set(range(15, 20)))
    trained, _ = train_draft(grown, train, held, out_dir=tmp_path / "run", total_steps=3, lr=1e-2, max_tokens=128,
                             eval_every=3, progress=False)
    assert trained.layers[1].attn.wo.weight.any(), "a new block's output projection must move with training"
    assert layers_of(tmp_path / "run" / "ckpt.pt") == 4
