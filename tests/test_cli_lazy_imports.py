"""`tidegate` subcommands import lazily: the gateway and the simulator never load torch.

The gateway process must stay light (it tokenizes with `tokenizers` alone), and `tidegate sim`
must start in a blink on a machine without torch; a stray import would silently break both.
"""
import json
import subprocess
import sys

PROBE = r"""
import contextlib, io, json, sys
from gateway.tidegate_cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc_help = main(["--help"])
    rc_plan = main(ARGS)
import gateway.serve, gateway.app, gateway.backend_pool, gateway.frontdoor, gateway.client  # noqa
import sims.event_loop, sims.cli  # noqa
print(json.dumps({"rc": [rc_help, rc_plan], "torch": "torch" in sys.modules,
                  "backend": sorted(m for m in sys.modules if m.startswith("backend."))}))
"""


def _probe(args: list[str]) -> dict:
    code = PROBE.replace("ARGS", repr(args))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sim_and_gateway_paths_never_import_torch():
    result = _probe(["sim", "plan", "--model", "deepseek-coder-33b", "--gpu", "h200", "--gpus", "1-2"])
    assert result["rc"] == [0, 0]
    assert result["torch"] is False
    # the gateway tokenizes through the torch-free tokenizer/ leaf and never imports backend/
    assert result["backend"] == []
