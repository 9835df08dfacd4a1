# minillm — the course's two commands are `make lab` and `make test`.
#
#   make lab     set up .venv with the course's "minillm" kernel, open JupyterLab on chapter 00
#   make test    set up .venv if missing, run lint, unit tests, exercise graders and every notebook
#   make demo    one generation in the terminal, with its TTFT / TPOT
#   make grade   your score on the exercises (exercises/), per chapter
#   make execute re-run the chapters in place, saving outputs and widget state (NB=one notebook)
#
# Variables:
#   LAB_ARGS     extra JupyterLab arguments; on a server without a browser:
#                make lab LAB_ARGS="--no-browser --ip=0.0.0.0"
#   TORCH_SPEC   which torch to install (default: the CPU build CI uses; with an NVIDIA GPU:
#                make lab TORCH_SPEC="torch>=2.4")

MAKEFLAGS += --no-print-directory  # `make grade` in JupyterLab's terminal runs inside `make lab`
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
LAB_ARGS ?=
STAMP := $(VENV)/.installed
NBVAL := --nbval-lax --nbval-current-env --nbval-cell-timeout=600 --nbval-sanitize-with tests/nbval_sanitize.cfg
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)  # containers and cloud machines often run as root

NB ?= chapters/*.ipynb

.PHONY: lab test unit notebooks lint demo grade execute clean

$(STAMP): pyproject.toml Makefile scripts/jupyterlab_overrides.json scripts/jupyter_server_config.json
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	PYTHONWARNINGS=ignore $(PY) -m pip install -q -e ".[course,serve,dev]"  # quiet: setuptools warns about editable installs
	$(PY) -m ipykernel install --sys-prefix --name minillm --display-name "minillm (.venv)"
	mkdir -p $(VENV)/share/jupyter/lab/settings $(VENV)/etc/jupyter
	cp scripts/jupyterlab_overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json  # widget state saved
	cp scripts/jupyter_server_config.json $(VENV)/etc/jupyter/jupyter_server_config.json  # ...and kept (widgets/save_hook.py)
	touch $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter trust chapters/*.ipynb  # the course's saved widgets render before anything runs
	@echo "Opening JupyterLab on chapters/00_setup.ipynb — the URL with its token is printed below."
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/chapters/00_setup.ipynb \
		$(ALLOW_ROOT) $(LAB_ARGS)

test: $(STAMP) lint
	$(PY) -m pytest tests chapters $(NBVAL) --durations=25  # the slowest tests listed: CI has 30 minutes

unit: $(STAMP)
	$(PY) -m pytest tests

execute: $(STAMP)
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=600 \
		--ExecutePreprocessor.kernel_name=minillm --ExecutePreprocessor.store_widget_state=True $(NB)
	$(PY) -m widgets.save_hook $(NB)  # the widget state as JupyterLab's save keeps it (widgets/save_hook.py)

notebooks: $(STAMP)
	$(PY) -m pytest chapters $(NBVAL)

lint: $(STAMP)
	$(PY) -m ruff check .

demo: $(STAMP)
	$(PY) -m minillm generate "What is 1+1? Answer:" --max-new-tokens 4 --temperature 0
	$(PY) -m minillm generate "ROMEO:" --max-new-tokens 60 --temperature 0.8 --top-p 0.95 --seed 0 --stream

grade: $(STAMP)
	$(PY) -m exercises.grading

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
