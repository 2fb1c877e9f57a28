# The preamble the GPU recipes share; `source "$(dirname "$0")/gpu_common.sh"` after setting
# OUT and DEVICE. It moves to the repository root, picks the Python (the .venv on a CPU check),
# installs the carried wheels (.whl/) where pyzmq/aiohttp are missing (the H200 lacks them),
# sets TG (the tidegate command), makes $OUT, and kills the processes listed in `pids` on exit.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-python3}
[ -x .venv/bin/python ] && [ "$DEVICE" = cpu ] && PY=.venv/bin/python
if ! $PY -c 'import zmq, aiohttp' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
TG="$PY -m gateway.tidegate_cli"
mkdir -p "$OUT"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
