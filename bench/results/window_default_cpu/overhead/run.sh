cd /work/main
for r in 1 2 3; do
  .venv/bin/tidegate bench overhead --paths http_gateway --concurrency 1 64 --duration 4 --gateway-arg=--target-throughput=8000 --json /tmp/slo/ov/old$r.json > /tmp/slo/ov/old$r.txt 2>&1
  .venv/bin/tidegate bench overhead --paths http_gateway --concurrency 1 64 --duration 4 --json /tmp/slo/ov/new$r.json > /tmp/slo/ov/new$r.txt 2>&1
done
