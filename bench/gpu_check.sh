#!/usr/bin/env bash
# The GPU check (issue 29): what the CPU suite cannot show, in one run of a few minutes on one
# CUDA GPU without internet. Stages, each under its own `timeout`, each going on past a failure:
#   env     torch / CUDA / NCCL / transformers / megatron versions; no CUDA: FAIL at once, exit 2
#   pytest  the `gpu`-marked tests (tests/trainer/test_gpu.py, tests/engine/test_runner.py)
#   train   a dense tiny Qwen3 trained 5 steps in bf16 on CUDA (bench/gpu_check.py train)
#   parity  the embedded engine's sampled log-probs vs the trainer's, fp32 and bf16, on CUDA
#   nccl    the tiny model's weights broadcast over NCCL between two processes
#   moe     a tiny Qwen3-MoE (4 experts, top 2) trained 5 steps in bf16 on CUDA
# Writes $OUT/gpu_check.json and $OUT/gpu_check.md (the summary) and $OUT/gpu_check.log (everything).
#
#   bash bench/gpu_check_wheels.sh          # once, with internet: megatron-core + msgspec into .whl/
#   bash bench/gpu_check.sh                 # on the GPU machine (installs .whl/ into $SITE when needed)
#   bash bench/gpu_check.sh --cpu-dry-run   # here: the no-CUDA failure, the wheel install, the stages on CPU
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=gpu
[[ ${1:-} == --cpu-dry-run ]] && MODE=cpu
OUT=${OUT:-$ROOT/gpu_check_out}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
: >"$OUT/stages.tsv"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
# The CPU dry run needs torch, which the system python3 here lacks: the project's venv has it.
if [[ $MODE == cpu && -x .venv/bin/python ]]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
# The stages import slimeish.{trainer,engine,models,common} only, which live in slimeish/ itself,
# so the repository root on the path is enough (no package-dir mapping for router/ or buffer/).
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# On the GPU machine the carried wheels go to $SITE (below), ahead of everything else.
[[ $MODE == gpu ]] && PYTHONPATH="$SITE:$PYTHONPATH"
export PY OUT SITE MODE
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} TOKENIZERS_PARALLELISM=false
START=$(date +%s)
# Well inside the 8 minutes a device run may take; a healthy run needs a fraction of it.
BUDGET=${BUDGET:-420}
DEVICE=cuda
[[ $MODE == cpu ]] && DEVICE=cpu

# run_stage NAME SECONDS CMD...: one stage under `timeout` (it signals the whole process group,
# so spawned workers go too); its exit code and wall time go to stages.tsv for the summary.
# Each limit is cut to what is left of BUDGET seconds, so the summary is written within it.
run_stage() {
  local name=$1 limit=$2 t0 rc left
  shift 2
  left=$((START + BUDGET - $(date +%s)))
  ((left < limit)) && limit=$left
  if ((limit < 5)); then
    echo "$name: FAIL no time left of the ${BUDGET}s budget"
    printf '%s\t%s\t%s\t%s\n' "$name" 124 0 0 >>"$OUT/stages.tsv"
    return 0
  fi
  echo "=== $name (limit ${limit}s): $*"
  t0=$(date +%s%N)
  timeout -k 10 "$limit" "$@"
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((($(date +%s%N) - t0) / 1000000))" "$limit" >>"$OUT/stages.tsv"
  [[ $rc == 124 || $rc == 137 ]] && echo "$name: FAIL timed out after ${limit}s"
  return 0
}

env_stage() {
  "$PY" - "$OUT/env.json" <<'PY'
import json, platform, sys
import torch
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(), "gpus": torch.cuda.device_count()}
if info["cuda_available"]:
    info["gpu"] = torch.cuda.get_device_name(0)
    nccl = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
    info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
for mod in ("transformers", "tokenizers", "megatron.core", "msgspec"):
    try:
        info[mod] = __import__(mod, fromlist=["_"]).__version__
    except Exception as e:
        info[mod] = f"missing: {e}"
info["status"] = "PASS" if "missing" not in str(info) else "FAIL"
json.dump({"stage": "env", **info}, open(sys.argv[1], "w"), indent=1)
print(f"env: {info['status']} {json.dumps(info)}")
PY
}

# Where megatron-core is not importable yet, install the carried wheels (no index, no deps).
install_wheels() {
  "$PY" -c "import megatron.core, msgspec" 2>/dev/null && { echo "wheels: already importable"; return 0; }
  ls .whl/*.whl >/dev/null 2>&1 || { echo "wheels: FAIL: no .whl/ (run bench/gpu_check_wheels.sh)"; return 1; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl &&
    "$PY" -c "import megatron.core, msgspec" && echo "wheels: installed into $SITE"
}

# The dry run cannot install cp312 wheels for this Python 3.11: it unpacks them for 3.12's tags into
# a temporary --target, which checks the set is complete, consistent and installable without an index.
dry_run_wheels() {
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --find-links .whl --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --target "$tmp" \
    .whl/*.whl && ls -d "$tmp"/megatron/core "$tmp"/msgspec && echo "wheels: PASS cp312 set unpacks into $tmp"
}

# No CUDA: fail at once, before anything is installed or built, with a summary that says why.
if [[ $MODE == gpu ]] && ! timeout 60 "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  reason="CUDA is not available to $PY (torch $("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)); \
this check needs a CUDA GPU, and 'bash bench/gpu_check.sh --cpu-dry-run' checks its packaging on CPU"
  echo "gpu_check: FAIL: $reason"
  printf '{"mode": "gpu", "ok": false, "stages": [{"stage": "env", "status": "FAIL", "reason": "%s"}]}\n' \
    "${reason//\"/\'}" >"$OUT/gpu_check.json"
  exit 2
fi

# The stage functions run under `timeout`, which needs a command: bash -c with the functions exported.
export -f env_stage install_wheels dry_run_wheels
if [[ $MODE == gpu ]]; then
  run_stage wheels 90 bash -c install_wheels
else
  run_stage wheels 90 bash -c dry_run_wheels
fi
run_stage env 60 bash -c env_stage
run_stage pytest 170 "$PY" -m pytest -q -p no:cacheprovider -m gpu --timeout 160 --junitxml "$OUT/pytest.xml" \
  tests/trainer/test_gpu.py tests/engine/test_runner.py
for stage in train parity nccl moe; do
  run_stage "$stage" 90 "$PY" -m bench.gpu_check "$stage" --device "$DEVICE" --out "$OUT"
done

"$PY" - "$OUT" "$MODE" "$(($(date +%s) - START))" <<'PY'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, mode, total = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
stages = []
for line in (out / "stages.tsv").read_text().splitlines():
    name, rc, ms, limit = line.split("\t")
    rec = {"stage": name, "rc": int(rc), "seconds": round(int(ms) / 1000, 1)}
    path = out / f"{name}.json"
    if path.exists():
        rec = json.loads(path.read_text()) | rec
    elif name == "pytest" and (out / "pytest.xml").exists():
        suite = ET.parse(out / "pytest.xml").getroot().find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        rec |= n
        # on a GPU every gpu-marked test must run; on the CPU dry run they must all skip cleanly
        ran = n["tests"] > 0 and n["failures"] == n["errors"] == 0
        rec["status"] = "PASS" if ran and (n["skipped"] == 0 if mode == "gpu" else n["skipped"] == n["tests"]) else "FAIL"
    else:
        rec["status"] = "PASS" if rc == "0" else "FAIL"
    if int(rc) in (124, 137):
        rec["status"], rec["reason"] = "FAIL", f"timed out after {limit}s" if limit != "0" else "no time left"
    elif int(rc) != 0 and rec.get("status") == "PASS":
        rec["status"] = "FAIL"
    stages.append(rec)
ok = all(s.get("status") in ("PASS", "SKIP") for s in stages) and any(s["stage"] == "train" for s in stages)
summary = {"mode": mode, "ok": ok, "total_seconds": total, "stages": stages}
(out / "gpu_check.json").write_text(json.dumps(summary, indent=1))
keys = ("seconds", "fp32_max_abs_gap", "cached_tokens", "bf16_max_abs_gap", "margin_before", "margin_after", "seconds_per_step",
        "peak_memory_mib", "tests", "skipped", "failures", "gb_per_s", "gpu", "torch", "nccl", "reason")
rows = ["| stage | status | numbers |", "|---|---|---|"]
for s in stages:
    nums = ", ".join(f"{k}={s[k]:.3g}" if isinstance(s[k], float) else f"{k}={s[k]}" for k in keys if k in s)
    rows.append(f"| {s['stage']} | {s.get('status')} | {nums} |")
(out / "gpu_check.md").write_text(f"# GPU check ({mode}): {'ok' if ok else 'FAILED'} in {total}s\n\n" + "\n".join(rows) + "\n")
print("\n".join(rows))
print(f"gpu_check: {'PASS' if ok else 'FAIL'} in {total}s; summary {out}/gpu_check.json")
sys.exit(0 if ok else 1)
PY
