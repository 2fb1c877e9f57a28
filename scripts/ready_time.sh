#!/bin/bash
# Issue 16's "ready" figure: wall seconds from starting `tidegate serve` (defaults: tiny-coder,
# embedded CPU backend) in the tree $1 until a 1-token completion answers on port $2. Appends
# `ready_s N` to /tmp/ready_$PORT.txt. Paired against another tree with farm-bench:
#   farm-bench -n 6 --timeout 300 --vs 'scripts/ready_time.sh /path/to/old 8128' -- scripts/ready_time.sh . 8127
cd "$1"; PORT=${2:-8123}
PY=${PY:-/work/main/.venv/bin/python}
[ -x "$PY" ] || PY=.venv/bin/python
start=$(date +%s.%N)
PYTHONPATH=$PWD $PY -m gateway.tidegate_cli serve --port $PORT > /tmp/ready_serve_$PORT.log 2>&1 &
pid=$!
until curl -s -m 1 -o /dev/null -w '%{http_code}' localhost:$PORT/v1/completions -H 'content-type: application/json' -d '{"model":"tiny-coder","prompt":"def","max_tokens":1}' 2>/dev/null | grep -q 200; do sleep 0.05; done
end=$(date +%s.%N)
echo "ready_s $(echo "$end - $start" | bc)" >> /tmp/ready_$PORT.txt
kill -INT $pid; wait $pid 2>/dev/null
