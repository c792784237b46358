# schedopt: `make demo` runs the main job, `make test` the whole suite, `make check` its fast subset.
# `make setup` creates .venv and installs everything; it reruns only when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    := out

.PHONY: setup test check demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
	# torch==2.13.0 is the CPU wheel on this machine's disk; any other spec pulls a multi-GB CUDA build.
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[torch,viz,dev,bench]'
	touch $(STAMP)

# one intra-op thread per process: two test workers on two cores, and the ranks they start, otherwise
# ask for more threads than there are cores (the whole suite: 360-375 s with torch's default, 318-321 s
# with one thread, interleaved A B A B on this machine)
TEST_ENV = OMP_NUM_THREADS=1

test: setup
	$(TEST_ENV) $(PY) -m pytest -q -n 2 --dist loadgroup --timeout=300

# the fast subset for the edit loop (no real ranks, no long solves): under a minute
check: setup
	$(TEST_ENV) $(PY) -m pytest -q -n 2 --timeout=120 -m "not slow"

demo: setup
	mkdir -p $(OUT)
	$(VENV)/bin/schedopt import examples/models.py:resnet50 --device a100 -o $(OUT)/graph.json
	# where scheduling matters: 8 ranks on 100 GbE, the next forward overlapping this step's all-reduces
	$(VENV)/bin/schedopt plan $(OUT)/graph.json --solver cpsat --mode overlap --network 100gbe --world-size 8 --time-limit 20 -o $(OUT)/plan.json
	$(VENV)/bin/schedopt simulate $(OUT)/plan.json $(OUT)/graph.json --trace $(OUT)/trace.json --gantt $(OUT)/gantt.png
	$(VENV)/bin/schedopt compare $(OUT)/graph.json --solvers all --mode overlap --network 100gbe --world-size 8 --time-limit 30 --out $(OUT)/compare
	cp $(OUT)/compare/compare.png $(OUT)/compare.png
	# the plan applied: two gloo ranks on localhost train gpt_tied, with DDP and with the plan
	# (localhost has no link, only memory copies that bend with the cache: --force keeps the fit, with a warning if it is off)
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 -m schedopt calibrate --max-size 16MiB --time-limit 15s --force --model examples/models.py:gpt_tied -o $(OUT)/cluster.json
	# profiled on both ranks at once, as they will train (they share this host's memory and caches)
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 -m schedopt profile examples/models.py:gpt_tied --iterations 3 -o $(OUT)/train_graph.json
	$(VENV)/bin/schedopt plan $(OUT)/train_graph.json --solver pytorch-ddp --cluster $(OUT)/cluster.json -o $(OUT)/ddp_plan.json
	$(VENV)/bin/schedopt plan $(OUT)/train_graph.json --solver cpsat --time-limit 10 --cluster $(OUT)/cluster.json -o $(OUT)/train_plan.json
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 examples/train.py gpt_tied --ddp --threads 1 --steps 8 --quiet --json $(OUT)/ddp_run.json
	SCHEDOPT_PLAN=$(OUT)/train_plan.json $(VENV)/bin/torchrun --standalone --nproc-per-node 2 examples/train.py gpt_tied --threads 1 --steps 8 --quiet --json $(OUT)/schedopt_run.json
	$(PY) examples/demo_summary.py $(OUT)/train_graph.json $(OUT)/cluster.json $(OUT)/ddp_plan.json:$(OUT)/ddp_run.json $(OUT)/train_plan.json:$(OUT)/schedopt_run.json
	# sharded through torch's FSDP2: per block (torchtitan's layout) and a cpsat plan within per block's peak (35.7 MiB)
	$(VENV)/bin/schedopt plan $(OUT)/train_graph.json --mode sharded --solver fsdp-per-block --cluster $(OUT)/cluster.json -o $(OUT)/fsdp_plan.json
	$(VENV)/bin/schedopt plan $(OUT)/train_graph.json --mode sharded --solver cpsat --memory-budget 36MiB --time-limit 10 --cluster $(OUT)/cluster.json -o $(OUT)/sharded_plan.json
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 examples/train.py gpt_tied --fsdp --threads 1 --steps 8 --quiet --json $(OUT)/fsdp_run.json
	SCHEDOPT_PLAN=$(OUT)/sharded_plan.json $(VENV)/bin/torchrun --standalone --nproc-per-node 2 examples/train.py gpt_tied --shard --threads 1 --steps 8 --quiet --json $(OUT)/sharded_run.json
	$(PY) examples/demo_summary.py $(OUT)/train_graph.json $(OUT)/cluster.json $(OUT)/fsdp_plan.json:$(OUT)/fsdp_run.json $(OUT)/sharded_plan.json:$(OUT)/sharded_run.json

bench: setup
	$(PY) bench/import_speed.py
	$(PY) bench/heuristics.py
	$(PY) bench/solver_quality.py
	$(PY) bench/solver_scale.py
	$(PY) bench/runtime_overhead.py
	# bench/testbed.py needs root (network namespaces): sudo $(PY) bench/testbed.py --model examples/models.py:resnet18

clean:
	rm -rf $(OUT) .pytest_cache .hypothesis build *.egg-info
