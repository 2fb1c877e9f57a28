"""The s14 6.7B profile with the `plan_lead_ms` that `tidegate backend profile` records since
2026-12-05 (40ca47c), computed the way the profiler does (bench/engine/profile.py: sims.profile_cost.plan_leads
on the profile's points, ms rounded to 4 places); the s14 profile predates it. Every other field unchanged.

    python make_profile.py SRC.json OUT.json
"""
import json
import sys
from pathlib import Path

from sims.profile_cost import plan_leads

src, out = sys.argv[1], sys.argv[2]
doc = json.loads(Path(src).read_text())
assert "plan_lead_ms" not in doc, "the profile already records plan_lead_ms"
leads = plan_leads({"points": doc["points"]})
doc["plan_lead_ms"] = {k.removesuffix("_s"): round(v * 1e3, 4) for k, v in leads.items()}
Path(out).write_text(json.dumps(doc, indent=1) + "\n")
print(f"{out}: plan_lead_ms {doc['plan_lead_ms']}")
