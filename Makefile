# The two commands a new user needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The Spark packages of include/spark_jars.py (Delta, the Kafka connector), fetched once beside
# the environment; include/spark.py finds them there (LAMBDALAKE_SPARK_JARS_DIR).
SPARK_JARS := $(VENV)/spark-jars
# The demo runs in its own home and starts from scratch each time; `make up` keeps its own.
DEMO_HOME := $(CURDIR)/.lambdalake/demo
PLATFORM_HOME ?= $(CURDIR)/.lambdalake/platform

.PHONY: install run test lint lock clean up down cluster-up cluster-down cluster-local-up cluster-local-down

install: $(STAMP) $(SPARK_JARS)/.packages

# Re-runs only when the lock or the project metadata change. Bytecode is compiled here: where it
# is never written (PYTHONDONTWRITEBYTECODE), every process would compile pyspark, Airflow & co.
# from source again (~4 s per process; benchmarks/DECISIONS.md).
$(STAMP): requirements/lock.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==0.13.8
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -r requirements/lock.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	touch $(STAMP)

# Spark's own resolution from Maven Central, again only when the package list changes. Offline it
# says in one line that Spark cannot write the lakehouse without them, and tries again next time.
$(SPARK_JARS)/.packages: include/spark_jars.py | $(STAMP)
	$(BIN)/python include/spark_jars.py --into $(SPARK_JARS) --offline-ok

run: install
	rm -rf $(DEMO_HOME)
	$(BIN)/lambdalake demo --home $(DEMO_HOME)

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .

up: install
	$(BIN)/lambdalake up --home $(PLATFORM_HOME)

down: install
	$(BIN)/lambdalake down --home $(PLATFORM_HOME)

# The cluster deployment (docker-compose.yml): Kafka, Spark master + worker, Airflow on Postgres.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)

cluster-up:
	@test -f .env || { echo "cluster-up: copy .env.example to .env and set its secrets first"; exit 1; }
	$(COMPOSE) up --build --detach
	@echo "Airflow: http://localhost:8080  Spark master: http://localhost:8081  Dashboard: http://localhost:8090/#token=<LAMBDALAKE_SERVE_TOKEN>"

cluster-down:
	$(COMPOSE) down

# The same services as processes on this machine, without Docker (lambdalake/cluster.py).
CLUSTER_HOME ?= $(CURDIR)/.lambdalake/cluster

cluster-local-up: install
	$(BIN)/lambdalake up --cluster --home $(CLUSTER_HOME)

cluster-local-down: install
	$(BIN)/lambdalake down --home $(CLUSTER_HOME)

lock: install
	$(BIN)/uv pip compile requirements/requirements.in --python-version 3.11 -o requirements/lock.txt

clean:
	rm -rf .lambdalake
