# Two commands do all set-up: `make lab` and `make test`. Set-up is idempotent.
PY_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# JupyterLab's settings overrides for this environment: no news prompt over the first chapter.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
# nbconvert's configuration for this environment: re-executed chapters store no widget state.
NBCONVERT_CONFIG := $(VENV)/etc/jupyter/jupyter_nbconvert_config.json

.PHONY: setup model peer peers vllm lab test demo bench record clean

# What the lab needs. The peers (llama-server) are not part of it: `make lab` opens on the default
# pair without waiting for them; `make test` and `make peers` build them.
setup: $(STAMP) model $(LAB_SETTINGS) $(NBCONVERT_CONFIG)

# torch is installed first and pinned, so pip takes the CPU build and never a CUDA one.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[lab,test]'
	touch $(STAMP)

$(LAB_SETTINGS): scripts/jupyterlab_overrides.json $(STAMP)
	install -D -m 644 $< $@

$(NBCONVERT_CONFIG): scripts/jupyter_nbconvert_config.json $(STAMP)
	install -D -m 644 $< $@

model: $(STAMP)
	$(PY) -m specdec_lab fetch
	-bash scripts/install_browser.sh

# The two peers, set up once, side by side: llama.cpp's llama-server and its converter, built into the
# cache (scripts/build_llama_cpp.sh: 8 to 14 minutes on 2 cores), and vLLM for CPU, installed into
# .venv-vllm/ (scripts/setup_vllm.sh: about 4 minutes, mostly downloads). The install runs while the
# build compiles; a failure of either stops set-up. `make lab` needs neither.
peers: $(STAMP)
	bash scripts/setup_vllm.sh > .venv-vllm.log 2>&1 & vllm=$$!; \
	bash scripts/build_llama_cpp.sh $(PY); built=$$?; \
	wait $$vllm; installed=$$?; cat .venv-vllm.log; rm -f .venv-vllm.log; \
	test $$built -eq 0 -a $$installed -eq 0

peer: $(STAMP)
	bash scripts/build_llama_cpp.sh $(PY)

vllm:
	bash scripts/setup_vllm.sh

# JupyterLab refuses to start as root unless told to (containers often run as root).
lab: setup
	$(VENV)/bin/jupyter lab notebooks/ $$(test "$$(id -u)" = 0 && echo --allow-root)

# The library's tests, then every notebook executed and compared by nbval, in two worker processes
# (pytest-xdist, one per core). --dist loadfile sends each file whole to one worker: a notebook's
# cells run in order in one kernel, and a module's tests share its module-scoped fixtures. The files
# go out in tests/conftest.py's order, the longest first (--no-loadscope-reorder keeps it). One torch
# thread per process: two workers fill the 2 cores (the browser test adds JupyterLab, a kernel and
# Chromium), and oversubscribed OpenMP threads slow torch down many times over. The chapters' graded
# exercise cells grade the reference (specdec_lab.lab.exercises.yours), as their stored outputs do.
test: setup peers
	$(VENV)/bin/lint-imports
	OMP_NUM_THREADS=1 SPECDEC_LAB_EXERCISES=reference $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder \
		tests notebooks --nbval \
		--sanitize-with notebooks/sanitize.cfg

demo: setup
	$(PY) -m specdec_lab generate --prompt "Why is the sky blue?" --k 4 --max-new-tokens 64

# The configuration docs/bench_full.json was measured with (36 minutes on 2 cores; about 90 on a day
# the machine read memory at 11 GB/s, docs/bench_slow_memory.json): three
# samples per prompt at temperature 0.7, where one answer per prompt leaves the figure to the seeds.
# Those runs predate the shipped feature draft and the self-draft: without --no-feature-draft and
# --no-self-draft the bench also runs their systems (docs/bench_feature_draft.json and
# docs/bench_self_draft.json are side-by-side runs of them).
bench: setup
	OMP_NUM_THREADS=1 $(PY) -m specdec_lab bench --prompts 24 --max-new-tokens 64 --ks 1-8 --threads 1 --samples 3 \
		--no-feature-draft --no-self-draft

# The figures the chapters quote, in one sitting on this commit (about 25 minutes; resumable):
# docs/record.json and docs/machine_profile.json. Then `python -m specdec_lab record --render`.
record: setup
	OMP_NUM_THREADS=1 $(PY) -m specdec_lab record

clean:
	rm -rf $(VENV) .venv-vllm .pytest_cache
