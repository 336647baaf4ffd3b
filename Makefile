# Two commands for a newcomer: `make demo` and `make test`. Each sets up what it needs the first
# time (apt packages, .venv, pip packages, the Panda and Go1 models) and is quick the second time.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Python 3.12 for the main environment: a `python3.12` on PATH, else a pyenv install.
PYTHON312 ?= $(shell for p in python3.12 $$(ls -d $$HOME/.pyenv/versions/3.12*/bin/python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null); do $$p -c 'import sys; assert sys.version_info[:2]==(3,12)' 2>/dev/null && { echo $$p; break; }; done)
STAMPS := .stamps
export MUJOCO_GL ?= egl

.PHONY: demo bridge-demo test test-e2e setup clean-venv bench base base-subskills extoken-bases

setup: $(STAMPS)/venv

APT_PACKAGES := libusb-1.0-0 socat tmux ffmpeg libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0

$(STAMPS)/apt:
	@mkdir -p $(STAMPS)
	@if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
	  echo ">> installing apt packages: $(APT_PACKAGES)"; \
	  SUDO=$$( [ $$(id -u) -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi
	@touch $@

$(STAMPS)/venv: pyproject.toml $(STAMPS)/apt
	@test -n "$(PYTHON312)" || { echo "Python 3.12 not found: install it (e.g. pyenv install 3.12) or pass PYTHON312=/path/to/python3.12"; exit 1; }
	@test -x $(PY) || { echo ">> creating $(VENV) with $(PYTHON312)"; $(PYTHON312) -m venv $(VENV); }
	@echo ">> installing the project and its dependencies into $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[sim,realsense,franka,data,vla,teleop,rig,scale,dev]'
	@echo ">> installing robot models (genesis-world --no-deps: MuJoCo Menagerie Franka Panda)"
	@$(PY) -m pip install -q --no-deps genesis-world
	@echo ">> installing robot models (mjlab --no-deps: Unitree Go1)"
	@$(PY) -m pip install -q --no-deps mjlab
	@touch $@

demo: setup
	$(VENV)/bin/vla demo --slice

bridge-demo: setup
	$(VENV)/bin/vla demo

# Two tiers (markers in pyproject.toml, tests/conftest.py): `make test` is the fast tier (the contracts: wire schema,
# watchdog, recorder SIGKILL, no torch on the Pi side, every policies.REGISTRY method on a toy env, a sim `vla record`);
# `make test-e2e` is the rest CI runs (bench smoke tests, multi-process and CLI end-to-end runs). CI runs both;
# `slow` and `hardware` stay out of either (`-m slow` by hand).
test: setup
	$(PY) -m pytest -m "not e2e and not slow and not hardware"

test-e2e: setup
	$(PY) -m pytest -m "e2e and not slow and not hardware"

bench: setup
	$(PY) -m bench.bridge

clean-venv:
	rm -rf $(VENV) $(STAMPS)

# The shipped multi-task base (vla/checkpoints/base, bench/results/vla_sft/README.md rounds 14 and 21-23): 60 scripted
# demos per task (seeds 0..59; a dataset left half-recorded by a kill is recorded again), `vla train` with the round-14
# recipe (base0), then BASE_DAGGER_ROUNDS DAgger rounds (round 21): the newest model drives BASE_DAGGER_EPISODES new
# scenes per task (round r: seeds 1000 + 40 (r - 1) ..), the scripted expert labels what it reaches (handover at the
# close, centring labels, the executed opening snapped shut / open), and a fine-tune from base0 on the demos plus every
# round so far trains only the chunk rows the expert carried out. Round 1 drives the pick tasks, later rounds every
# task. The last model replaces the committed one. Recordings run BASE_JOBS at a time, each on a bridge of its own
# (`vla record --serve own`). The default, 2 rounds, made the committed weights (round 23): 68 min on 2 cores (demos
# 10.5, base0 19, round 1 7 + 10, round 2 14 + 8); BASE_DAGGER_ROUNDS=0 is round 14's recipe alone (about 30 min).
BASE_TASKS ?= pick_red_cube pick_blue_cube lift_green_cube place_cube_in_bowl stack_cubes
# tasks recorded with each frame labelled by the sub-skill the expert is in (none for the shipped base)
BASE_SEGMENTED ?=
BASE_DATA ?= data/base
BASE_EPISODES ?= 60
BASE_OUT ?= vla/checkpoints/base
BASE_TRAIN_FLAGS ?= --steps 6000 --batch-size 128 --balance tasks --head-hidden 512 --head-depth 4
BASE_DAGGER_ROUNDS ?= 2
BASE_DAGGER_EPISODES ?= 40
# TASK=N pairs: N DAgger episodes for TASK instead of BASE_DAGGER_EPISODES (a long task's episodes cost several)
BASE_DAGGER_EPISODES_EACH ?=
BASE_DAGGER_TASKS_1 ?= pick_red_cube pick_blue_cube lift_green_cube
BASE_DAGGER_TASKS ?= $(BASE_TASKS)
BASE_DAGGER_FLAGS ?= --dagger-temporal-ensemble --dagger-noise zero --dagger-gripper $(BASE_GRIPPER) --dagger-handover close \
  --dagger-labels correct
# a segmented task's DAgger episodes (BASE_SEGMENTED): the model runs the task as the sequence of sub-skill prompts
# the expert reads off each state, from its own hand-overs, and each frame is labelled with its sub-skill
BASE_DAGGER_SUBSKILL_FLAGS ?= --label-subskills --dagger-prompts subskills --dagger-handover never
BASE_FT_FLAGS ?= --steps 2000 --warmup-steps 100 --batch-size 128 --balance tasks --shift-pad 0 --aug-views 1 \
  --dagger-rows coherent
# the executed gripper opening the model is measured and run with (config.json execution.gripper: `--gripper auto`
# in vla eval / record --dagger / serve / export; round 22: binary beats raw on the committed base, 170 vs 153 of 250)
BASE_GRIPPER ?= binary
BASE_JOBS ?= 2
# run each line of stdin as a shell command, BASE_JOBS at a time; fails when any of them fails
PARALLEL = xargs -P $(BASE_JOBS) -I{} sh -c {}
base: setup
	@mkdir -p $(BASE_DATA); for t in $(BASE_TASKS); do \
	  d=$(BASE_DATA)/q1_$$t; lab=; \
	  case " $(BASE_SEGMENTED) " in *" $$t "*) lab=--label-subskills;; esac; \
	  if [ -f $$d.complete ]; then echo ">> $$d: recorded already" >&2; \
	  else echo "'rm -rf $$d && $(VENV)/bin/vla record --robot sim-franka-fast --task $$t --teleop scripted \
	    --episodes $(BASE_EPISODES) $$lab --serve own --root $$d > $$d.log 2>&1 && touch $$d.complete'"; fi; \
	done | $(PARALLEL) || { echo "a recording failed: see $(BASE_DATA)/q1_*.log"; exit 1; }
	@set -e; run=runs/base-$$(date +%Y%m%d-%H%M%S); mkdir -p $$run; \
	demos="$(foreach t,$(BASE_TASKS),--dataset $(BASE_DATA)/q1_$(t))"; \
	$(VENV)/bin/vla train $$demos --out $$run/base0 $(BASE_TRAIN_FLAGS) --threads 2; \
	model=$$run/base0/model; dagger=; \
	for r in $$(seq 1 $(BASE_DAGGER_ROUNDS)); do \
	  tasks="$(BASE_DAGGER_TASKS)"; [ $$r = 1 ] && tasks="$(BASE_DAGGER_TASKS_1)"; \
	  seed=$$((1000 + $(BASE_DAGGER_EPISODES) * (r - 1))); \
	  for t in $$tasks; do dagger="$$dagger --dataset $$run/dagger_r$${r}_$$t"; done; \
	  for t in $$tasks; do d=$$run/dagger_r$${r}_$$t; sub=; n=$(BASE_DAGGER_EPISODES); \
	    case " $(BASE_SEGMENTED) " in *" $$t "*) sub="$(BASE_DAGGER_SUBSKILL_FLAGS)";; esac; \
	    for kv in $(BASE_DAGGER_EPISODES_EACH); do [ "$${kv%%=*}" = $$t ] && n=$${kv#*=}; done; \
	    echo "'$(VENV)/bin/vla record --robot sim-franka-fast --task $$t --teleop scripted --dagger $$model \
	      $(BASE_DAGGER_FLAGS) $$sub --episodes $$n --seed $$seed --serve own --root $$d > $$d.log 2>&1'"; \
	  done | $(PARALLEL) || { echo "a DAgger recording failed: see $$run/dagger_r$${r}_*.log"; exit 1; }; \
	  $(VENV)/bin/vla train $$demos $$dagger --init $$run/base0/model --out $$run/dagger_r$$r $(BASE_FT_FLAGS) \
	    --feature-cache $(BASE_DATA)/feature_cache --threads 2; \
	  model=$$run/dagger_r$$r/model; \
	done; \
	rm -rf $(BASE_OUT) && mkdir -p $$(dirname $(BASE_OUT)) && cp -r $$model $(BASE_OUT); \
	$(PY) -c "import json, os; p = '$(BASE_OUT)/config.json'; d = json.load(open(p)); t = d['train']; \
	t['datasets'] = [os.path.relpath(x) for x in t['datasets']]; \
	t.update({k: os.path.relpath(t[k]) for k in ('init',) if isinstance(t.get(k), str)}); \
	d['execution'] = {'gripper': '$(BASE_GRIPPER)'}; \
	json.dump(d, open(p, 'w'), indent=2)"; \
	echo ">> $(BASE_OUT) <- $$model; measure it: .venv/bin/vla eval --checkpoint $(BASE_OUT) --episodes 50 \
	--noise zero --videos 0"

# The sub-skill base (SARL's, vla/checkpoints/base_subskills; bench/results/README.md "The sub-skill base on the round-23 recipe", issue 63):
# the shipped base's recipe (round 23: demos, base0, two DAgger rounds) on the five tasks plus put_all_cubes_in_bowl,
# the three long tasks recorded with each frame labelled by its sub-skill ("pick up the red cube", "put it in the
# bowl", "put it on the red cube") and trained under both labels (the task prompts too, with their trained
# paraphrases: SARL's prompt library holds them). Round 2's DAgger runs each
# long task as its sequence of sub-skill prompts (BASE_DAGGER_SUBSKILL_FLAGS), so the model visits its own
# hand-over states and the expert labels them (20 episodes of the 420-tick put_all_cubes_in_bowl, 40 of the
# others). Measure it: python -m bench.vla_subskills --checkpoint
# vla/checkpoints/base_subskills --handover both --episodes 50
base-subskills:
	$(MAKE) base BASE_TASKS="pick_red_cube pick_blue_cube lift_green_cube place_cube_in_bowl stack_cubes \
	  put_all_cubes_in_bowl" BASE_SEGMENTED="place_cube_in_bowl stack_cubes put_all_cubes_in_bowl" \
	  BASE_DATA=data/base_subskills BASE_OUT=vla/checkpoints/base_subskills \
	  BASE_DAGGER_EPISODES_EACH="put_all_cubes_in_bowl=20" BASE_TRAIN_FLAGS="$(BASE_TRAIN_FLAGS) --paraphrases sim" \
	  BASE_FT_FLAGS="$(BASE_FT_FLAGS) --paraphrases sim"

# ExToken's two bases (bench/results/README.md "ExToken", round 3): pick_red_cube_yaw45 recorded in both grasp turns
# over the same 160 scenes (seeds 1000..1159, so the image does not give the turn away), behaviour tokens from the
# turns (`vla tokens`), then the token-conditioned VLA and the token-free one on the same demos, copied to
# $(EXTOKEN_OUT)/tokens and notokens (not committed): `python -m bench.extoken --checkpoint runs/extoken/tokens
# --baseline-checkpoint runs/extoken/notokens`.
# About 12 min recording + 2 x 17 min training on 2 cores.
EXTOKEN_DATA ?= data/extoken
EXTOKEN_SCENES ?= 160
EXTOKEN_OUT ?= runs/extoken
EXTOKEN_TRAIN_FLAGS ?= --steps 6000 --batch-size 128 --head-hidden 512 --head-depth 4 --crop front=0.2,0.35,0.8,0.85 \
  --fine-blocks 3 --shift-pad 0 --aug-views 1 --threads 2
extoken-bases: setup
	@for m in ccw cw; do d=$(EXTOKEN_DATA)/yaw45_$$m; \
	  if [ -f $$d.complete ]; then echo ">> $$d: recorded already"; \
	  else rm -rf $$d && $(VENV)/bin/vla record --robot sim-franka-fast --task pick_red_cube_yaw45 --teleop scripted \
	         --expert-mode $$m --episodes $(EXTOKEN_SCENES) --seed 1000 --root $$d && touch $$d.complete || exit 1; fi; \
	done
	$(VENV)/bin/vla tokens --dataset $(EXTOKEN_DATA)/yaw45_ccw --dataset $(EXTOKEN_DATA)/yaw45_cw --k 2 \
	  --purity-field expert_mode --out $(EXTOKEN_DATA)/tokens_k2.json
	@for kind in tokens notokens; do run=runs/extoken_$$kind-$$(date +%Y%m%d-%H%M%S); \
	  tok=; [ $$kind = tokens ] && tok="--tokens $(EXTOKEN_DATA)/tokens_k2.json --token-dropout 0.2"; \
	  $(VENV)/bin/vla train --dataset $(EXTOKEN_DATA)/yaw45_ccw --dataset $(EXTOKEN_DATA)/yaw45_cw $$tok \
	    $(EXTOKEN_TRAIN_FLAGS) --out $$run || exit 1; \
	  rm -rf $(EXTOKEN_OUT)/$$kind && mkdir -p $(EXTOKEN_OUT) && cp -r $$run/model $(EXTOKEN_OUT)/$$kind || exit 1; \
	done
	@echo ">> $(EXTOKEN_OUT)/tokens, $(EXTOKEN_OUT)/notokens; measure: .venv/bin/python -m bench.archive.token_scenes \
	--checkpoint $(EXTOKEN_OUT)/tokens --tokens $(EXTOKEN_DATA)/tokens_k2.json \
	--baseline-checkpoint $(EXTOKEN_OUT)/notokens"
