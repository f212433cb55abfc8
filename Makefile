# The two commands a new user needs: `make demo` and `make test`.
# Both set up everything on a fresh machine with only Python 3.11 and root.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup java compiler chromium demo test docs soak lint bench-state-ops bench-checkpoint bench-checkpoint-s3 bench-query-state bench-spark bench-large-state bench-continuous bench-continuous-batch bench-kafka peers clean

setup: java compiler chromium $(STAMP)

# Java 17 for Spark (the Spark runtime needs a JVM); installed only if missing.
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "java not found: installing OpenJDK 17 (headless) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; }

# Chromium for the checkpoint page's browser test (tests/test_checkpoint_page.py), from
# Debian's packages; installed only if missing.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "chromium not found: installing it with apt-get (the browser test of weir ui)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# A C compiler and the Python headers: pip builds the hash map's C fast paths
# (src/weir/state/_hashcore.c, _keycell.c). Installed only if missing.
compiler:
	@command -v cc >/dev/null 2>&1 || { \
	  echo "cc not found: installing gcc with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc; }
	@$(PYTHON) -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' || { \
	  echo "Python.h not found: installing python3-dev with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-dev; }

$(STAMP): pyproject.toml $(wildcard src/weir/state/_*.c src/weir/state/_*.h)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "weir needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: setup
	$(PY) -m weir.examples.fraud_demo

# Two test processes (pytest-xdist), each with its own SparkSession: a test waits on a
# JVM, a subprocess or a timer most of the time, so two share the 2 cores of CI. The
# long runs go first (tests/conftest.py) and an idle process steals queued tests from
# the other (worksteal): both end at about the same time.
test: setup
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=30

# The user guide and the API reference (mkdocs.yml, docs/) into site/, in strict mode: a
# broken link, anchor or cross-reference fails the build (make test builds it too:
# tests/test_docs.py, which also runs every ```python block of docs/).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The long fault-injection runs: kill -9 of executors and drivers on local-cluster,
# six seeds over 12 files (make test runs one over 6); speculative and zombie attempts
# on a two-host standalone cluster; Flink's acceptance shape and SIGKILL restarts on
# the continuous runtime over both backends (make test runs one), locally and on a
# local-cluster (make test: RocksDB), its seeded kill -9 run over 20 seeds (make test
# runs one), a crash at every write step of a checkpoint (make test: the first of
# each kind of file), rescaling from unaligned checkpoints (make test: 2 -> 3), and
# kill -9 of the driver and the broker under weir-kafka (make test: of a Python worker).
soak: setup
	WEIR_FAULT_SEEDS=0,1,2,3,4,5 $(PY) -m pytest -q -s tests/test_spark_cluster_faults.py
	WEIR_SOAK=1 $(PY) -m pytest -q tests/test_spark_speculation.py \
		tests/test_continuous_acceptance.py tests/test_continuous_job.py \
		tests/test_continuous_kills.py tests/test_checkpoint_faults.py \
		tests/test_continuous_spark_cluster.py tests/test_unaligned_rescale.py \
		tests/test_spark_errors.py tests/test_kafka_spark_faults.py

lint: setup
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy

bench-state-ops: setup
	$(PY) -m bench.state_ops

bench-checkpoint: setup
	$(PY) -m bench.checkpoint

# checkpoints on S3 (a SeaweedFS server of the dev extras, on loopback) vs local disk
bench-checkpoint-s3: setup
	$(PY) -m bench.checkpoint_s3

bench-query-state: setup
	$(PY) -m bench.query_state

bench-spark: setup
	$(PY) -m bench.spark_keyed_count
	$(PY) -m bench.spark_keyed_count --latency

bench-large-state: setup
	$(PY) -m bench.spark_large_state

# The continuous runtime's peers (PyFlink, Bytewax) in a virtualenv of their own: they pin
# versions weir's .venv does not take. Only the benchmark installs them, never make test.
PEERS_VENV  := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

peers: java $(PEERS_STAMP)

$(PEERS_STAMP): bench/peers/requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q -r bench/peers/requirements.txt
	@touch $(PEERS_STAMP)

bench-continuous: setup peers
	$(PY) -m bench.continuous_keyed_count
	$(PY) -m bench.continuous_latency
	$(PY) -m bench.continuous_checkpoint_overhead
	$(PY) -m bench.backpressure
	$(PY) -m bench.live_query

bench-continuous-batch: setup
	$(PY) -m bench.continuous_batch_count

# Kafka in and out on both runtimes, beside the raw limit of the same loop in one process
# (confluent-kafka), against a noida-db broker (the dev extras') on loopback
bench-kafka: setup
	$(PY) -m bench.kafka_keyed_count


clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
