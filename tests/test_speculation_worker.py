"""Predicted Outputs over the wire (issue 28): a real worker process gets GenerateRequest's
prediction frame and speculation control, returns the same greedy tokens as without them, and
reports the draft / prediction counters in RequestOutput."""
from __future__ import annotations

import torch

from proto import tidegate_pb2 as pb
from tests.backend_helpers import DealerClient, WorkerProcess, make_checkpoint


def _batch(c: DealerClient, requests: dict, predictions: dict, spec: dict | None = None,
           max_tokens: int = 24) -> None:
    env = pb.Envelope(batch=pb.Batch())
    arrays = []
    for rid, prompt in requests.items():
        r = env.batch.requests.add(request_id=rid, prompt_frame=len(arrays))
        arrays.append(prompt)
        r.sampling.max_tokens = max_tokens
        r.sampling.ignore_eos = True
        if rid in predictions:
            r.prediction_frame = len(arrays)
            arrays.append(predictions[rid])
        if spec and rid in spec:
            r.speculation.off, r.speculation.max_draft_tokens = spec[rid]
    c.send(env, arrays)


def test_prediction_over_the_socket(tmp_path):
    path = make_checkpoint(tmp_path, "gqa4_tied_rope4")
    w = WorkerProcess(["--model", str(path), "--block-size", "4", "--num-blocks", "200",
                       "--max-num-seqs", "8", "--max-num-batched-tokens", "64"],
                      f"ipc://{tmp_path}/w.sock")
    try:
        c = DealerClient(w.endpoint)
        c.hello()
        g = torch.Generator().manual_seed(1)
        prompts = {f"p{i}": torch.randint(0, 300, (9 + i,), generator=g).tolist()
                   for i in range(3)}
        _batch(c, prompts, {})
        plain, plain_finals, _ = c.collect(list(prompts))
        assert not c.errors
        # again with the exact outputs as predictions, one with speculation off, one capped
        again = {f"s{rid}": p for rid, p in prompts.items()}
        preds = {f"s{rid}": plain[rid] for rid in prompts}
        _batch(c, again, preds, {"sp1": (True, 0), "sp2": (False, 2)})
        spec, finals, _ = c.collect(list(again))
        assert not c.errors
        for rid in prompts:
            assert spec[f"s{rid}"] == plain[rid], rid
        f0, f1, f2 = finals["sp0"], finals["sp1"], finals["sp2"]
        assert f0.num_accepted_prediction_tokens == 24 and f0.num_rejected_prediction_tokens == 0
        assert f0.num_draft_tokens >= f0.num_accepted_draft_tokens > 0
        assert f1.num_draft_tokens == 0 and f1.num_accepted_prediction_tokens == 24
        assert 0 < f2.num_draft_tokens
        # a prediction with ids outside the vocabulary fails only its request
        _batch(c, {"bad": prompts["p0"]}, {"bad": [10_000]})
        _, finals, _ = c.collect(["bad"])
        assert c.errors and c.errors[-1].request_id == "bad"
        assert c.errors[-1].code == pb.Error.INVALID_REQUEST and "prediction" in c.errors[-1].message
        # speculation by draft source in the load reports (the one of the busy -> idle edge
        # came before that error): every request's drafts, attributed to their sources
        report = c.load_reports[-1][1]
        by = {s.source: s for s in report.spec_decode}
        assert set(by) == {"prediction", "prompt", "session"}
        everyone = [*plain_finals.values(), f0, f1, f2]
        for field in ("num_draft_tokens", "num_accepted_tokens"):
            per_request = field if field == "num_draft_tokens" else "num_accepted_draft_tokens"
            assert sum(getattr(s, field) for s in by.values()) == \
                sum(getattr(f, per_request) for f in everyone)
        assert by["prediction"].num_accepted_tokens >= f0.num_accepted_draft_tokens > 0
        assert sum(by["prediction"].num_accepted_tokens_per_pos) == \
            by["prediction"].num_accepted_tokens
        assert w.terminate() == 0
    finally:
        w.kill()
