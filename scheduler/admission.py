"""Admission that predicts the wait: refuse at once what cannot meet its TTFT deadline.

The gateway (wall clock) and the simulator (virtual clock) run this same code; time is an
argument. A new class-`c` request's time to first token is predicted as

    ttft = window + gateway_ahead / capacity + min over backends b of (ahead_b * gap_b + service_b)
           ──────   ──────────────────────────   ─────────────────────────────────────────────────
           the batching   requests of class <= c       the backend it would be placed on: requests
           window still   queued in the gateway,       of class <= c sent there and not started
           to wait        at every backend's rate      (no first token yet), one start every gap_b,
                          (sum of 1 / gap_b)           then its own prefill (service_b)

Two figures per backend, both measured from what the gateway sees (dispatches and first tokens):

- ``gap_b``: the mean time between first tokens while requests were waiting to start there
  (a start is *paced* when another request sent there was still unstarted at the previous start:
  the gap between the two measured the backend, not the arrivals). An exponentially weighted
  mean of those gaps (weight `gap_weight`), so it follows the backend's speed under load without
  being lowered by idle spells. 1 / gap_b is the backend's start capacity (requests/s).
- ``service_b``: what a request's dispatch → first token took beyond its queue: that time minus
  (requests ahead of it at dispatch) x gap_b, over every started request (only those that found
  nothing ahead until gap_b is known), weighted the same way. It follows the backend's current
  step time: under decode load a step is slower, and the start of a request with nothing ahead
  waits for the step in progress and then its own. (Measured only from requests that found an
  empty queue, it stayed at its light-load value under saturation: on the CPU at 2x capacity
  a third of the admitted requests then missed their deadline.) Kept per class: a fast request
  with nothing fast ahead still waits for the step in progress, which a slow request's figure,
  or the average over classes, does not say; a class with no sample yet uses the backend's
  all-class figure.

Until a backend has `min_samples` paced gaps its term is ``service_b`` alone (it admits: no
evidence of a queue). Classes: the backends serve Fast first (their step scheduler uses the same
classes), so only requests of the same or a higher class count as ahead; a Slow request sees
every queue and is refused first as load rises, then Normal, then Fast — shedding by class,
gradually, with no extra rule.

A refusal carries the predicted TTFT as its retry-after: the wait the request would have had
(the time for the work ahead of it to start), which the gateway sends as `Retry-After` (whole
seconds, rounded up) and `retry-after-ms` ("Retry-After" below).

The service is not one number per class: a request whose prompt is mostly in the backend's
prefix cache starts sooner, and a backend decoding many sequences runs slower steps. Each start
also records its uncached prompt tokens u and the backend's decoding sequences d at dispatch;
`scheduler.service_fit` fits the slopes of the service on u and d over the backend's recent
starts, and a prediction is ``class service + k_u (u - class mean u) + k_d (d - class mean d)``
(the class's figure alone while the slopes are unknown: u and d never varied). Placement
(`scheduler.ttft_placement`) compares backends by this prediction with each backend's own u.
`decoding(b)` is ``inflight(b) - unstarted there``: `inflight` is the owner's count of requests
on b not yet finished (the gateway's pool, the simulator's outstanding count).

Calibration: each start also compares its measured service with what was predicted for it at
dispatch (`started(..., predicted_s)`), per class, over the last `calibration_window` starts:
error = measured - predicted, in seconds, kept apart by how many requests were ahead of it
(none, 1-3, more: `AHEAD_BUCKETS`), as a queue's errors are larger than a lone start's and a
burst's should not be charged to the starts that follow it. Admission refuses a request unless its prediction
plus the `calibration_quantile` of those errors meets the deadline (a request admitted at a
prediction just under its deadline missed it whenever the prediction was low: 14.5% of the
accepted missed by > 10% on the CPU), and the Retry-After is the prediction plus their median
(the point estimate of the wait; the gap model's only: the slot model's Retry-After is its
prediction, `AdmissionConfig.retry_after_calibrated`). Additive, not a ratio: the errors come from discrete events
(the step in progress, when a running sequence frees a slot) whose size does not scale with
the prediction; as ratios, a 20 ms prediction that waited 100 ms for a slot made every later
prediction five times longer (4 echo backends at 1.5x capacity: 62% of normal requests
refused with Retry-After p50 1.67x the wait they had). Both are 0 until a class has
`calibration_min_samples` errors. Errors older than `calibration_horizon_s` are dropped (at
each check): only admitted requests measure one, so a class whose every request a burst's
errors refused would otherwise keep those errors, and be refused, for good (seen in the
simulator: after a burst at 0.8x capacity every normal request was refused to the end).

Overtaking (`AdmissionConfig.class_ordered`, opt-in: `tidegate serve --overtake`, the simulator's
`--overtake` with `--waiting-by-class`; not with the slot model, which projects them itself). A
backend that admits its waiting requests by class (`tidegate backend --waiting-by-class`) starts
the Fast and Normal requests sent *after* a waiting Slow one before it, so its wait is not the
queue ahead at dispatch: with that queue's work w = ahead x gap_b and the higher classes' recent
arrival rate there rate_h (`higher_rate`, the slot model's), each arrival during the wait W
takes one start, W = w + rate_h x gap_b x W:

    W = ahead x gap_b / (1 - rate_h x gap_b)        (max_wait_s where rate_h x gap_b >= 1)

(`overtaken_wait`; `overtake_horizon_s`: those arrivals over that long at most, W = w + rate_h x
gap_b x H past it). The class's service then leaves out the higher classes' requests sent after
it that started first (`started`; the all-class figure and the slopes' fit do not: fed that, the
fit's slopes moved the Fast predictions). Without it the gap model under-predicts a Slow wait by
1 - rate_h x gap_b, which the class's service EWMA and the calibration margin only partly absorb.
Simulated 33B H200 (s13 profile, one backend, Fast first, 400 requests, seeds 0-4 x 18-27 req/s;
issue 31, fifteenth session, bench/results/slo_gap_class_s15): Slow prediction / actual p50
0.62 -> 1.00 at 24.45 req/s seed 2 (the runs' median 0.83 -> 1.22), but Slow refused 212 ->
438, all of them requests the control run served within 10 s: a 400-request run's Fast and
Normal arrivals stop after ~16 s, and the Slow queue then drains at the full start rate, which
no projection of the recent rate sees; in longer overloads (1,200 requests, seeds 0-4, 24.45
req/s) Slow met 1,368 -> 1,706 and the admitted Slow requests missing by > 10% 148 -> 54. With
a 5 s horizon: 400 requests, Slow refused 212 -> 151, but 1,200 requests, Slow misses 148 ->
259. Hence opt-in.

Slots (issue 31; `slot_model`, opt-in: `tidegate serve --slot-model`, where the owner gives a
`clock`). The gap term above is a
mean; what a request waits on a backend whose slots (`max_num_seqs`) are all taken is the time
until the slot it gets frees, which the gateway can tell: each running request sends its last
token at about (its first token) + (max_tokens - 1) x step (an upper bound where a stop token
ends it sooner), the step being measured from finished requests ((last - first token) / (tokens
- 1), weighted as the service). The requests sent and not started take the slots free now, in
the order they were sent; the slots that free later go first to the requests of the new one's
class or a higher one (the backend serves Fast first) and to the higher classes' requests
expected meanwhile (their recent rate there), each holding its slot for its max_tokens steps:
a small event simulation over the running requests' ends. A request that gets a free slot
waits for the step in progress and its own (measured from such starts: `free_service`); one
that waits for a slot starts in the step after it frees. The concurrency: the backend's
max_num_seqs as it reports it (BackendInfo.max_num_seqs; the simulator's configured figure:
`set_slots`) from the start, replaced once measured: the running requests (less those ending in
the step that ends now) whenever a request sent more than two steps earlier is still waiting
there, those ending in the step that ends now included, the most seen, at most the report (a
KV-bound or shared backend runs fewer of ours than its max_num_seqs). The step: a backend none
of whose requests has finished takes the one measured over every backend's
(`AdmissionConfig.fleet_step`), and the higher classes' arrival rate there is read over the
time it has been counting (`rate_from_start`). Until the step is measured somewhere, and the
concurrency reported or measured (a backend that reports none and was never full), the gap term
predicts. 4 x 8 slots at 1.5x capacity, seeds 0-9: admitted missing by > 10% 49 -> 11 of ~5,300,
38 -> 2 of them in the first 2.2 s (issue 31, sixth session). On the
simulator's 4 x 8-slot x 20 ms backends at 1.5x capacity with placement by predicted TTFT,
Fast TTFT p90 of the admitted 209 -> 87 ms, accepted missing by > 10% 6.8 -> 3.4% (5 seeds).

Admission and Retry-After differ there (`AdmissionConfig.arrival_quantile`): the Retry-After is
the wait with the higher classes' arrivals at their mean ("Retry-After" below); a Slow
request is admitted only if its wait meets the deadline in (by default) every one of 64
fixed Poisson futures of those arrivals, simulated the same way (the Fast and Normal arrivals after it decide when it
gets a slot: its waits span x3.3-3.8 from p10 to p90 of the futures; with the mean, 3.4-3.9% of
the admitted missed by > 10%). 1.5x capacity, 10 seeds: Slow admitted missing by > 10% 176 -> 14, Slow met
35.8 -> 42.8%; at 1.0x 83 of 1,237 Slow requests refused that the mean admitted.

A free slot is not a Slow request's for certain (`AdmissionConfig.compete_steps`): the backend
admits its waiting requests at its next step's start, Fast first, so a Fast or Normal request
sent before then takes it. In the admission check (the arrivals' upper quantile), the higher
classes' requests expected before that step (its start read from the last token seen there and
the step: `compete_phase`) take the spare free slots with probability p (Poisson); the check
takes the quantile of the mixture: the free slot while p <= 1 - q, else the (1 - (1 - q) / p)
quantile of the waits given the loss (`_contested_wait`). 4 x 8
slots, seeds 0-29: at 1.5x the admitted missing by > 10% 33 -> 19 (Slow 17 -> 8), Slow met
44.9 -> 41.2% of sent, Fast and Normal +0.3-0.4 points; at 1.0x none missed either way and
Slow met 93.6 -> 89.8% (issue 31, seventh session).

Normal's overtakers (`AdmissionConfig.normal_overtake_quantile`, opt-in: `tidegate serve
--normal-overtake-quantile Q`). A Normal request's slot goes to every Fast request that arrives
before it frees; the mean projection expects the first of them only 1 / (their rate) after now
(~0.8 s at 1.2 Fast/s a backend), so a Normal request whose slot frees just before its deadline
is admitted, and one early Fast arrival makes it miss. On the issue's live benchmark (s15's 28
runs, lag-traced halves) 20 of its 22 traced Normal misses had 1-4 Fast requests sent after it
start first, without whom every one would have met its deadline (issue 31, sixteenth session,
bench/results/slo_misses_s16). With Q, Normal is admitted only if its wait at the Q-quantile
of those arrivals over the same 64 futures meets the deadline too (its Retry-After stays the
point estimate). Simulated twin, seed 2, 10 repeats with +-0.3 ms step jitter, Q 0.95: Normal
admitted missing by > 10% 12 -> 1, Normal refused 46 -> 106 of 4,340, Slow refused 819 -> 800;
seeds 0-9 unjittered: misses 2 -> 1, refused 6 -> 43 of 4,215; at 1.0x 0 -> 2 refused.
The projected rate is the one sent to the backend, over 2 s: ~2 Fast requests at 1.2 Fast/s a
backend, so an admitted Normal request often read no Fast arrival to come (live, with Q 0.95,
still 1-3 passed each of the 5 Normal misses in 10 runs). `fleet_arrival_rate` (opt-in,
`--fleet-arrival-rate`) reads it as every backend's rate averaged (4x the events). Simulated
(seed 2, 10 jittered repeats): alone, admitted misses 14 -> 7 (Normal 12 -> 6, Slow 2 -> 0),
Normal refused 46 -> 25, Slow 819 -> 842; with Q 0.95, misses 2, Normal refused 76, Slow 825.

Deadline order. With `send_deadlines` (`tidegate serve --send-deadlines`) each admitted request
carries its TTFT deadline to its backend; a backend with `--deadline-order`
(scheduler.deadline_order) then gives its last free slot to the earliest-deadline request when
that one would miss waiting for the next slot and the class order's next one would not. The
predictions here are unchanged: a request is passed by fewer later arrivals near its deadline
(the projection is then on the safe side), and the head it passes was projected to meet its own
deadline after the next slot (Fast's wait grows by at most that; simulated, Fast TTFT p90 and
refusals unchanged: bench/results/slo_deadline_s17).
Live, that benchmark, admitted missing by > 10% per run (default 15 runs / Q 0.95 10 / fleet 5
/ both 5): 2.33 / 1.00 / 2.20 / 0.80; Normal refused 13.3 / 24.7 / 10.8 / 22.6; Normal
Retry-After within +-25% of the probe 92.1 / 82.9 / 78.9 / 74.3%, Slow 25.6 / 33.0 / 19.9 /
26.0%. Worse on Normal's Retry-After and refusals: neither is the default.

Retry-After. The Retry-After is the point estimate above: the wait with the higher classes'
arrivals at their mean. `AdmissionConfig.retry_after_quantile` (opt-in) takes instead a
quantile (0.5: the median) of the wait over the same 64 futures admission's upper quantile
reads (a contested free slot: the mixture's quantile). Evenly spaced arrivals never bunch, so
the mean under-states a wait that Poisson bunches of Fast and Normal arrivals lengthen, and
where their recent rate fills every slot it lets the request in only past the 5 s horizon,
although most futures' lulls do sooner. Scored on forked futures (`tidegate sim retry-bound`:
the arrivals after each refusal redrawn 10 times, the refused request sent anyway), 4 x 8
slots at 1.5x, seeds 0 / 1 / 2, the median puts the Slow Retry-After within +-25% of the wait
in 44.3 -> 47.5 / 44.0 -> 44.1 / 37.9 -> 40.6% of the worlds (the best any rule can do from
the state at the refusal: ~62%); live, against the benchmark's probes, it halved the p90 of
|Retry-After / wait - 1| (1.9-2.1 -> 1.0) but put fewer within +-25% (32-33 -> 28%), where the
probes' waits hardly follow any of the slot model's predictions past 0.1 s (issue 31,
fourteenth session). The gap model's Retry-After adds its pool's median error
(`retry_after_calibrated`).

`headroom(now)`: per backend and in total, 1 / gap_b (the start rate the SLOs can take) minus
the recent start rate: the extra requests/s before queues grow and deadlines start to fail.
"""
from __future__ import annotations

import argparse
import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from scheduler.classes import CLASS_NAMES
from scheduler.service_fit import ServiceFit
from scheduler.slo import NUM_CLASSES, SLOTargets

POISSON_EXACT = 64  # Poisson thresholds tabulated (AdmissionConfig.max_arrivals_sim at most)
# the shortest time a backend's arrival rate is read over (`WaitPredictor.higher_rate`): 4 x 8
# slots, seeds 0-9, floors of 0.25 / 0.5 / 1 s gave the same outcome within one request
RATE_MIN_SPAN_S = 0.5


@dataclass(frozen=True)
class AdmissionConfig:
    slo: SLOTargets = field(default_factory=SLOTargets)
    gap_weight: float = 0.05      # EWMA weight of one paced gap (~20 starts of memory)
    service_weight: float = 0.1   # EWMA weight of one start's service time (module doc)
    min_samples: int = 8          # paced gaps before a backend's queue counts in predictions
    rate_window_s: float = 2.0    # time constant of the recent start rate (headroom)
    # the service fit's slopes are used once u / d spread this much (scheduler.service_fit)
    min_spread_tokens: float = 16.0
    min_spread_decoding: float = 1.0
    # calibration (module doc): measured - predicted service of the last starts per class
    calibration_quantile: float = 0.9
    calibration_window: int = 200
    calibration_min_samples: int = 20
    calibration_horizon_s: float = 10.0
    # the slot model (module doc, "Slots"): off -> the paced-gap queue term alone. Opt-in: it
    # assumes backends whose queue is slot-bound and served Fast first (the echo engine; our
    # engine admits FCFS, and its waits on GPUs are often the prefill budget's, not slots')
    slot_model: bool = False
    max_slot_sim: int = 32        # requests ahead simulated one by one; past that, by the pace
    max_arrivals_sim: int = 32    # higher classes' expected arrivals simulated; past that, the pace
    max_wait_s: float = 60.0      # the longest wait predicted
    arrival_horizon_s: float = 5.0  # higher classes' arrivals expected over this long at most
    # the time constant of the higher classes' arrival rate the slot model projects (None:
    # rate_window_s). A refusal follows a burst, so the last 2 s's rate is the burst's; with
    # Poisson arrivals the rate to expect next is the long-run one (issue 31, fourth session)
    arrival_window_s: float | None = None
    # Retry-After = the prediction + the median of its pool's errors (True) or the prediction
    # alone (False); None: calibrated for the gap model's predictions, not for the slot
    # model's. The errors are the admitted requests': those predicted short, which a noisy
    # prediction under-states (a Slow request predicted to wait 0.2-1 s, admitted, then passed
    # by Fast and Normal arrivals: median error +1.28 s); a refusal was predicted long, which
    # it over-states. 4 x 8 slots at 1.5x, 20 forked futures per Slow refusal
    # (sims.retry_after_bound): within +-25% in 17.9% of the worlds calibrated, 35.3% not, the
    # ceiling 50.9%; Retry-After over the median wait 1.63 and 1.13 (issue 31, fourth session)
    retry_after_calibrated: bool | None = None
    # a slot-model calibration pool short of samples takes the errors of: "class", its class's
    # three pools together (the third session's rule); "shorter", its class's pools of the
    # same or a shorter predicted wait, then every class's such pools. With "class" a Slow
    # request with a free slot took the margin of Slow requests that had waited for slots
    # (their 0.9 quantile 3.96 s) and was refused: 27 of 74 Slow refusals in the simulator,
    # most of which would have started within 0.1 s. Simulated, 4 x 8 slots at 1.5x, seeds
    # 0-4: Slow met 30.2 -> 40.1% of sent, admitted missing by > 10% 3.5 -> 3.4% (all
    # classes; issue 31, fourth session)
    slot_fallback: str = "shorter"
    # the slot model's Retry-After (opt-in): this quantile of the refused request's wait over
    # the same futures of the higher classes' arrivals that admission's upper quantile reads
    # (`arrival_samples`; 0.5: their median) instead of the wait with the arrivals at their mean
    # (None, the default). The mean spaces the Fast and Normal arrivals evenly: it under-states
    # a wait that Poisson bunches lengthen, and where their recent rate fills every slot it lets
    # the request in only past the 5 s horizon, although most futures' lulls do sooner. In the
    # simulator it is the better estimate (4 x 8 slots at 1.5x, 10 forked futures per Slow
    # refusal, seeds 0 / 1 / 2: within +-25% of the wait in 44.3 -> 47.5 / 44.0 -> 44.1 /
    # 37.9 -> 40.6% of the worlds, |error| p90 0.86 -> 0.85 / 0.84 -> 0.84 / 1.08 -> 0.92);
    # live (the same benchmark's probes, 4 rounds alternated at load 3-6) it halved the
    # |error| p90 (1.92-2.14 -> 1.01) but put fewer within +-25% (31.8-33.2 -> 27.6%): not the
    # default (issue 31, fourteenth session; module doc, "Retry-After")
    retry_after_quantile: float | None = None
    # admission's (not Retry-After's) slot wait of a request of class `arrival_quantile_from`
    # or lower (2: Slow): the higher classes' arrivals after it projected at their mean (None:
    # the Retry-After's point estimate) or for an upper quantile q of the wait (module doc,
    # "Slots"): "sampled", the q-quantile of the waits over `arrival_samples` fixed Poisson
    # futures at the recent rate (0.99 of 64: the longest); "path", the arrivals at the
    # q-quantile of a Poisson count at every time (`poisson_thresholds`: cheaper, more
    # pessimistic at low load). A Slow request's wait is set by the Fast and Normal arrivals
    # after it, which take every slot that frees while one waits: the mean admitted Slow
    # requests predicted to wait 0.1-0.9 s that waited 1.1-5 s. 4 x 8 slots, 20 ms steps, 1.5x
    # capacity (47.8 req/s), workload seeds 0-9, mean -> sampled 0.99 (issue 31, fifth
    # session): Slow admitted missing by > 10% 176 -> 14 (of 637 -> 547), met 35.8 -> 42.8%
    # of sent; Normal met 97.4 -> 98.5%, Fast 96.5 -> 98.9% (fewer Slow holding slots 1.3-1.6
    # s). The cost is at lower load: at 1.0x (31.9 req/s) the mean admitted every Slow request
    # and 1,235 of 1,237 met; sampled 0.99 refuses 83 (Slow met 93.3%). Normal too (from 1):
    # Slow misses 6, met 48.2%, but Normal met 95.8% at 1.5x (Normal's wait is the queue
    # ahead of it, which no later arrival passes)
    arrival_quantile: float | None = 0.99
    arrival_quantile_mode: str = "sampled"
    arrival_samples: int = 64
    arrival_quantile_from: int = 2
    # the slot model's concurrency from the start: each backend's max_num_seqs as it reports it
    # (BackendInfo.max_num_seqs; the simulator: --max-num-seqs), until it has been seen full
    # (`WaitPredictor.set_slots`). False: measured only, as before (issue 31, sixth session)
    reported_slots: bool = True
    # a backend none of whose requests has finished yet takes the step time measured on the
    # others (they serve one model; its own replaces it at its first finish). Without it the
    # slot model is off there until then: on 4 x 8 slots at 1.5x, a backend whose first 8
    # requests were long (seed 5: 0.6-0.9 s) took 11 more while the gap model predicted 46 ms
    # for each; 9 missed (issue 31, sixth session). False: measured only, as before
    fleet_step: bool = True
    # the higher classes' arrival rate over the time the backend has been counting while that is
    # shorter than the window (the count over the whole window before: in the first 2 s it read
    # the rate x (1 - e^(-t / 2 s)), 39% of it at 1 s, and the first Slow requests were admitted
    # on futures with too few Fast and Normal arrivals: all of the Slow requests admitted live
    # were sent in the first 2.2 s, a third of them missed). 4 x 8 slots, seeds 0-9, 1.0x / 1.5x
    # / 2.0x: admitted missing by > 10% 0 / 16 / 58 -> 0 / 11 / 34; Slow met 93.7 -> 93.4%,
    # 42.9 -> 42.7%, 10.4 -> 10.4% (issue 31, sixth session). False: as before
    rate_from_start: bool = True
    # in a check at an upper quantile of the higher classes' arrivals (`arrival_quantile`: a
    # Slow request's admission), a free slot is not its for certain: the backend admits its
    # waiting requests at its next step's start, Fast first, so a Fast or Normal request sent
    # before then takes the slot. The higher classes' arrivals of each future within this many
    # steps compete for the free slots (with the requests sent before it; the first to arrive
    # get them), and one that loses them waits for the next to free. 0: the free slot is its,
    # as before. Live, 3 of 12 misses: Slow requests predicted to start at once (31-39 ms)
    # that waited 1.7-2.5 s, a Normal request sent 0.2 ms later in the one free slot (issue 31,
    # sixth session's records)
    # 4 x 8 slots, seeds 0-29, 1.5x: admitted missing by > 10% 33 -> 19, Slow met 44.9 -> 41.2%
    # of sent; at 1.0x 0 -> 0, Slow met 93.6 -> 89.8% (module doc; issue 31, seventh session)
    compete_steps: float = 1.0
    # the window ends at the backend's next step start as read from its last token seen (a
    # step's end) and the step time, at most `compete_steps` steps away (False: the whole
    # `compete_steps`: seeds 0-9, 1.0x Slow met 88.5 -> 85.5%, 1.5x misses 4 -> 6)
    compete_phase: bool = True
    # a lost free slot's wait, where another backend has a free slot now: the next slot to free
    # here (the later higher-class arrivals placed there) instead of the futures' quantile.
    # Off: seeds 0-29, 1.5x, misses 33 -> 32 with it (Slow 17 -> 11), Slow met 44.0%; at 1.0x
    # Slow met 93.1% (the futures' wait given the loss over-states it there: simulated, the
    # Slow requests that lost a free slot at 1.0x waited 0.107 s at the median, the model's
    # median 0.228 s, as placement sends the arrivals to the free backends)
    compete_elsewhere: bool = False
    # the higher classes' arrivals while the request waits in its batching window compete for
    # the free slots too: they go out in its window (or before it) and the backend admits Fast
    # first, so the contest lasts from now to its window's flush (`check`'s window_s) and on
    # to the backend's next step after that (its phase read at the flush). Off (the default):
    # from now to the backend's next step after now, as if it were sent now. With 600 ms
    # windows, off, a Slow request checked within ~1 ms of a step's predicted start (at ~12
    # higher-class arrivals/s there) was admitted on a free slot that its window's Fast and
    # Normal requests then took, and one checked a millisecond earlier was refused: the
    # simulator and the live gateway, whose reads of a step's end jitter by 0.5-2 ms, disagreed
    # on those. Simulated, 4 x 8 slots, 600 ms windows, seeds 0-9: at 1.5x Slow admitted
    # missing by > 10% 22 -> 0, Normal met 93.5 -> 96.3%, Slow met 47.5 -> 29.3% of sent; at
    # 1.0x no misses either way, Slow met 85.3 -> 69.2%. With the default 5 ms windows: at
    # 1.5x Slow met 39.3 -> 37.4%, misses 2 -> 4 (issue 31, ninth session). `tidegate serve
    # --compete-window`
    compete_window: bool = False
    # the backends admit their waiting requests by class, Fast first (`tidegate backend
    # --waiting-by-class`, the echo engine, the simulator's `--waiting-by-class`): the gap
    # model projects the higher classes' requests that will arrive and pass a waiting one
    # (module doc, "Overtaking"). False: the gap term is the queue ahead alone, as on an FCFS
    # backend. Not with `slot_model`, which projects those arrivals itself
    class_ordered: bool = False
    # the higher classes' arrivals projected over this long at most (None: for as long as the
    # request waits; module doc, "Overtaking")
    overtake_horizon_s: float | None = None
    # a Normal request's admission (not its Retry-After) with the slot model: its slot wait at
    # this upper quantile of the Fast arrivals after it (which the backend starts first), over
    # the same futures a Slow request's `arrival_quantile` reads, must meet its deadline too
    # (None: the mean projection alone, as before; `arrival_quantile_from` <= 1 puts Normal on
    # `arrival_quantile` instead). Opt-in (`tidegate serve --normal-overtake-quantile`; module
    # doc, "Slots"; issue 31, sixteenth session)
    normal_overtake_quantile: float | None = None
    # the higher classes' arrival rate the slot model projects on a backend: the fleet's mean
    # per backend (every backend's decayed count of them, averaged) instead of the count sent
    # to that backend, which at 1.5x on 4 backends rests on ~2 Fast requests in its 2 s window
    # (an admitted Normal request read no Fast arrival to come, and one came). Opt-in
    # (`tidegate serve --fleet-arrival-rate`; module doc, "Slots"; issue 31, sixteenth session)
    fleet_arrival_rate: bool = False
    # the gateway sends each admitted request's TTFT deadline (GenerateRequest.deadline), by
    # which backends with `tidegate backend --deadline-order` start a waiting request whose
    # deadline is near before the higher classes (scheduler.deadline_order). Admission's
    # predictions are unchanged (module doc, "Deadline order"). Opt-in (`tidegate serve
    # --send-deadlines`; the simulator's `--deadline-order`; issue 31, seventeenth session)
    send_deadlines: bool = False

    def __post_init__(self) -> None:
        for name in ("gap_weight", "service_weight"):
            w = getattr(self, name)
            if not 0 < w <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {w}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")
        if not self.rate_window_s > 0:
            raise ValueError(f"rate_window_s must be > 0, got {self.rate_window_s}")
        if self.arrival_window_s is not None and not self.arrival_window_s > 0:
            raise ValueError(f"arrival_window_s must be > 0, got {self.arrival_window_s}")
        if self.slot_fallback not in ("class", "shorter"):
            raise ValueError(f"slot_fallback must be 'class' or 'shorter', got {self.slot_fallback!r}")
        if self.arrival_quantile is not None and not 0.0 < self.arrival_quantile < 1.0:
            raise ValueError(f"arrival_quantile must be in (0, 1), got {self.arrival_quantile}")
        if self.arrival_quantile_mode not in ("path", "sampled") or self.arrival_samples < 1:
            raise ValueError("arrival_quantile_mode must be 'path' or 'sampled', "
                             "arrival_samples >= 1")
        if not self.compete_steps >= 0.0:
            raise ValueError(f"compete_steps must be >= 0, got {self.compete_steps}")
        if self.retry_after_quantile is not None and not 0.0 < self.retry_after_quantile < 1.0:
            raise ValueError(f"retry_after_quantile must be in (0, 1), got {self.retry_after_quantile}")
        if self.overtake_horizon_s is not None and not self.overtake_horizon_s > 0:
            raise ValueError(f"overtake_horizon_s must be > 0, got {self.overtake_horizon_s}")
        q = self.normal_overtake_quantile
        if q is not None and not 0.0 < q < 1.0:
            raise ValueError(f"normal_overtake_quantile must be in (0, 1), got {q}")
        if self.max_arrivals_sim > POISSON_EXACT:
            raise ValueError(f"max_arrivals_sim must be <= {POISSON_EXACT}")
        if not 0.5 <= self.calibration_quantile <= 1.0 or self.calibration_window < 1:
            raise ValueError("calibration_quantile must be in [0.5, 1], calibration_window >= 1")

    @property
    def enabled(self) -> bool:
        """Admission refuses only where some class has a TTFT deadline."""
        return self.slo.any_ttft


def add_overtake_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--overtake`, `--overtake-horizon-s`, `--normal-overtake-quantile` and
    `--fleet-arrival-rate` (`tidegate serve`, the simulator, decision fidelity):
    AdmissionConfig.class_ordered, overtake_horizon_s (module doc, "Overtaking"),
    normal_overtake_quantile and fleet_arrival_rate ("Slots")."""
    p.add_argument("--overtake", action="store_true",
                   help="the backends admit waiting requests Fast first (tidegate backend "
                   "--waiting-by-class): admission's gap model projects the Fast and Normal "
                   "requests that will arrive and start before a waiting one, W = ahead x gap / "
                   "(1 - their rate x gap) (AdmissionConfig.class_ordered; opt-in; not with "
                   "--slot-model; the simulator: with --waiting-by-class only)")
    p.add_argument("--overtake-horizon-s", type=float, default=None, metavar="S",
                   help="with --overtake: project those arrivals over S seconds at most "
                   "(default: for as long as the request waits)")
    p.add_argument("--fleet-arrival-rate", action="store_true",
                   help="with --slot-model: project the higher classes' arrivals on a backend at "
                   "the fleet's mean rate per backend, not the rate sent there "
                   "(AdmissionConfig.fleet_arrival_rate; opt-in)")
    p.add_argument("--normal-overtake-quantile", type=float, default=None, metavar="Q",
                   help="with --slot-model: admit a Normal request only if its slot wait at the "
                   "Q-quantile of the Fast arrivals after it (which the backend starts first) "
                   "meets its deadline too (AdmissionConfig.normal_overtake_quantile; opt-in)")


AHEAD_BUCKETS = 3  # calibration pools by requests ahead: none, 1-3, more


def pool(cls: int, ahead: int) -> int:
    return cls * AHEAD_BUCKETS + (0 if ahead <= 0 else 1 if ahead <= 3 else 2)


SLOT_POOLS = NUM_CLASSES * AHEAD_BUCKETS  # the slot model's pools come after the gap model's
SLOT_WAIT_STEPS = 10.0  # slot-model pools by the predicted slot wait: none, <= 10 steps, more


def slot_pool(cls: int, wait: float, step: float) -> int:
    """The calibration pool of a slot-model prediction: its errors are not the gap model's
    (kept apart: a fresh backend's gap-model errors, hundreds of ms, would otherwise widen the
    slot model's margin for 10 s), and they grow with the wait predicted."""
    return SLOT_POOLS + cls * AHEAD_BUCKETS + (
        0 if wait <= 0.0 else 1 if wait <= SLOT_WAIT_STEPS * step else 2)


@functools.lru_cache(maxsize=16)
def poisson_thresholds(q: float) -> tuple[float, ...]:
    """m_k for k = 0..POISSON_EXACT-1: the Poisson mean past which the q-quantile of the count
    is at least k + 1 (P(N <= k) = q at mean m_k). The slot model projects the k+1-th
    higher-class arrival at time m_k / rate; the mean projection's m_k is k + 1."""
    out = []
    for k in range(POISSON_EXACT):
        lo, hi = 0.0, k + 10.0 + 10.0 * math.sqrt(k + 1.0)
        for _ in range(50):  # P(N <= k) falls as m grows
            m = 0.5 * (lo + hi)
            term = cdf = math.exp(-m)
            for j in range(1, k + 1):
                term *= m / j
                cdf += term
            if cdf > q:
                lo = m
            else:
                hi = m
        out.append(0.5 * (lo + hi))
    return tuple(out)


MEAN_ARRIVALS = tuple(float(k + 1) for k in range(1024))  # the mean projection's thresholds


@functools.lru_cache(maxsize=4)
def sampled_arrivals(n: int, length: int) -> tuple[tuple[float, ...], ...]:
    """`n` fixed futures of a unit-rate Poisson process, `length` arrivals each (cumulative
    exponential gaps, seeded: the same futures in the gateway and the simulator)."""
    rng = random.Random(31)
    out = []
    for _ in range(n):
        t, path = 0.0, []
        for _ in range(length):
            t += rng.expovariate(1.0)
            path.append(t)
        out.append(tuple(path))
    return tuple(out)


class Refusal(NamedTuple):
    queue_class: int
    predicted_ttft_s: float   # what it would have waited for its first token
    deadline_s: float         # its class's (or its own) TTFT target

    @property
    def retry_after_s(self) -> float:
        return self.predicted_ttft_s

    def message(self) -> str:
        return (f"The {CLASS_NAMES[self.queue_class]} class's time-to-first-token deadline "
                f"({self.deadline_s * 1000:.0f} ms) cannot be met: the predicted wait is "
                f"{self.predicted_ttft_s * 1000:.0f} ms. Retry after that long.")


class _Backend:
    __slots__ = (
        "arr_mt",
        "arr_rate",
        "arr_t",
        "arr_t0",
        "class_d",
        "class_service",
        "class_u",
        "ended",
        "fit",
        "free_service",
        "gap",
        "last_start",
        "marks",
        "num_gaps",
        "num_steps",
        "paced",
        "queued",
        "rate",
        "rate_t",
        "reported_slots",
        "running",
        "seen_slots",
        "service",
        "slots",
        "started_n",
        "step",
        "tick",
        "unstarted",
    )

    def __init__(self, config: AdmissionConfig, reported_slots: int = 0) -> None:
        self.unstarted = [0] * NUM_CLASSES  # sent here, no first token yet, by class
        self.gap = 0.0          # EWMA of paced gaps, s
        self.num_gaps = 0
        self.service = 0.0      # EWMA of the service time (module doc) over every class, s
        self.class_service = [0.0] * NUM_CLASSES  # the same per class (0: no sample yet)
        self.class_u = [0.0] * NUM_CLASSES  # the class's mean uncached tokens, same weights
        self.class_d = [0.0] * NUM_CLASSES  # ... and decoding sequences at dispatch
        self.fit = ServiceFit(config.service_weight, config.min_spread_tokens,
                              config.min_spread_decoding)
        self.last_start = -math.inf
        # overtaking (AdmissionConfig.class_ordered): starts here per class, and for each
        # unstarted request (key) the higher classes' starts and unstarted requests at its
        # dispatch: the starts of theirs beyond those that were ahead of it passed it
        self.started_n = [0] * NUM_CLASSES
        self.marks: dict = {}
        self.paced = False      # at the last start, another request here was still unstarted
        self.rate = 0.0         # decayed count of starts (rate = count / window)
        self.rate_t = 0.0
        # the slot model (module doc): requests sent here by key, in dispatch order, not
        # started: (class, max_tokens, dispatch time, predicted slot wait or -1); started and
        # not finished: (first token time, max_tokens); the step time (EWMA of finished
        # requests' mean inter-token time) and the concurrency seen while requests queued
        self.queued: dict = {}
        self.running: dict = {}
        self.ended: deque = deque(maxlen=16)  # the last tracked requests' end times
        # per class, then over every class (last): EWMA of the dispatch -> first token of
        # requests sent with a free slot predicted (0: no sample yet)
        self.free_service = [0.0] * (NUM_CLASSES + 1)
        # per class: decayed count of the requests sent here (rate = count / rate_window_s)
        # and their mean max_tokens: the higher classes' arrivals that will take slots ahead
        # of a waiting lower-class request (the backend serves Fast first)
        self.arr_rate = [0.0] * NUM_CLASSES
        self.arr_mt = [0.0] * NUM_CLASSES
        self.arr_t = 0.0
        self.arr_t0: float | None = None  # the first request sent here (the count's start)
        self.step = 0.0
        self.num_steps = 0
        self.tick = -math.inf  # the last first or last token seen from it: a step's end
        # the concurrency: the backend's max_num_seqs as it reported it (BackendInfo; 0:
        # unknown), the most running seen while requests waited there (0: never seen full), and
        # the figure the slot model uses (`WaitPredictor.set_slots`: the report until the
        # backend has been seen full, then what was seen, at most the report)
        self.reported_slots = reported_slots
        self.seen_slots = 0
        self.slots = reported_slots


class WaitPredictor:
    """Per-backend queues and speeds as the gateway sees them; see the module doc."""

    def __init__(self, config: AdmissionConfig = AdmissionConfig()) -> None:
        self.config = config
        self.backends: dict[int, _Backend] = {}
        # the owner's count of requests on a backend not yet finished (module doc); None: 0
        self.inflight: Callable[[int], int] | None = None
        # the owner's clock (the gateway's, the simulator's virtual one): the slot model
        # predicts from times; None: the slot model is off
        self.clock: Callable[[], float] | None = None
        # calibration per class: recent measured - predicted errors (s) and their quantiles
        # per (class, requests ahead bucket): index cls * AHEAD_BUCKETS + ahead_bucket(ahead)
        pools = 2 * NUM_CLASSES * AHEAD_BUCKETS  # the gap model's, then the slot model's
        self.errors = [deque(maxlen=config.calibration_window) for _ in range(pools)]
        self.error_high = [0.0] * pools  # the calibration quantile (admission)
        self.error_mid = [0.0] * pools   # the median (Retry-After)
        self.num_errors = [0] * pools
        # backend -> its max_num_seqs as reported (set_slots), kept for a backend not seen yet
        self._reported: dict[int, int] = {}
        # the step time over every backend's finished requests (the same EWMA as a backend's
        # own), and the backends with no step of their own yet, which take it
        # (AdmissionConfig.fleet_step)
        self.fleet_step = 0.0
        self._borrowing: set[int] = set()
        # the gap model projects the higher classes' arrivals that pass a waiting request
        # (module doc, "Overtaking"): on class-ordered backends, where the slot model is off
        self.overtaking = config.class_ordered and not config.slot_model

    # ---- membership ------------------------------------------------------------------------
    def add_backend(self, b: int) -> None:
        self._new_backend(b)

    def _new_backend(self, b: int) -> _Backend:
        be = self.backends[b] = _Backend(self.config, self._reported.get(b, 0))
        self._borrowing.add(b)
        if self.config.fleet_step:
            be.step = self.fleet_step
        return be

    def remove_backend(self, b: int) -> None:
        self.backends.pop(b, None)
        self._reported.pop(b, None)
        self._borrowing.discard(b)

    def set_slots(self, b: int, max_num_seqs: int) -> None:
        """Backend `b` runs `max_num_seqs` sequences at most (its BackendInfo; the simulator's
        configured figure; 0: unknown). The slot model predicts from it at once, before it has
        seen `b` full: until then, on a fresh backend, it had no concurrency and the gap model
        predicted, which admits until a queue has shown (the fifth session's warm-up: 13 of the
        18 admitted misses of 4 x 8 slots at 1.5x, seeds 0-4, in the first ~2.2 s).

        Once `b` has been seen full (a request sent more than two steps earlier still waiting
        at a start), what ran there then is the figure, at most the report: a backend whose KV
        cache, not max_num_seqs, bounds its batch (long prompts), or that other gateways share,
        runs fewer of this gateway's requests than it reported, and predicting the reported
        slots would send requests to slots that are not free. The most seen is kept (a count
        can read low: a one-token request other than the one starting is not tracked); it grows
        back toward the report, never past it. Not the other way (the report always): that
        admits on a KV-bound backend until its deadline misses show in the calibration. On the
        echo simulator (slot-bound, one gateway) the two differ by little: 4 x 8 slots, seeds
        0-9, 1.0x / 1.5x / 2.0x capacity, admitted missing by > 10% 0 / 16 / 58 either way;
        at 1.0x 78 Slow requests refused this way, 74 with the report always (issue 31, sixth
        session, before `rate_from_start`)."""
        n = max(0, int(max_num_seqs))
        if n:
            self._reported[b] = n
        else:
            self._reported.pop(b, None)
        be = self.backends.get(b)
        if be is not None:
            be.reported_slots = n
            be.slots = min(be.seen_slots, n) if be.seen_slots and n else (be.seen_slots or n)

    # ---- events ----------------------------------------------------------------------------
    def dispatched(self, b: int, cls: int, key=None, max_tokens: int = 0) -> int:
        """A class-`cls` request was sent to `b`. Returns how many requests of its class or a
        higher one were unstarted there (pass it back to `started`). `key` (its id) and
        `max_tokens`: the slot model follows it to its end (`started`, `finished`, `gone`)."""
        be = self.backends.get(b)
        if be is None:  # a backend seen for the first time (it joined the pool)
            be = self._new_backend(b)
        ahead = sum(be.unstarted[: cls + 1])
        if key is not None and self.clock is not None:
            now = self.clock()
            w = self._slot_wait(be, cls, 0, now)
            mt = max(1, max_tokens)
            be.queued[key] = (cls, mt, now, -1.0 if w is None else w)
            if be.arr_t0 is None:
                be.arr_t0 = now
            cfg = self.config
            decay = math.exp(-max(0.0, now - be.arr_t) / (cfg.arrival_window_s or cfg.rate_window_s))
            be.arr_t = now
            rates = be.arr_rate
            for k in range(NUM_CLASSES):
                rates[k] *= decay
            rates[cls] += 1.0
            be.arr_mt[cls] += (mt - be.arr_mt[cls]) / min(rates[cls], 20.0)
            if self.overtaking and cls:
                be.marks[key] = sum(be.started_n[:cls]) + sum(be.unstarted[:cls])
        be.unstarted[cls] += 1
        return ahead

    def decoding(self, b: int) -> int:
        """Requests on `b` past their first token and not finished (0 without `inflight`)."""
        be = self.backends.get(b)
        if be is None or self.inflight is None:
            return 0
        return max(0, self.inflight(b) - sum(be.unstarted))

    def started(self, b: int, cls: int, now: float, service_s: float, ahead: int,
                uncached: int = 0, decoding: int = 0, predicted_s: float = 0.0,
                key=None) -> None:
        """Its first token arrived at `now`, `service_s` after it was sent, with `ahead`
        requests ahead of it then (`dispatched`'s answer), `uncached` of its prompt tokens not
        expected in the prefix cache, `decoding` sequences decoding there at dispatch, and
        `predicted_s` what `backend_ttft` predicted for it then (0: none; calibration)."""
        be = self.backends.get(b)
        if be is None:
            return
        cfg = self.config
        slot_wait = -1.0  # the slot model's wait predicted at dispatch (-1: none)
        entry = be.queued.pop(key, None) if key is not None else None
        if entry is not None:
            slot_wait = entry[3]
        mark = be.marks.pop(key, None) if key is not None and be.marks else None
        if predicted_s > 0.0:
            k = pool(cls, ahead) if slot_wait < 0.0 else slot_pool(cls, slot_wait, be.step)
            self._calibrate(k, service_s - predicted_s, now)
        if be.unstarted[cls] > 0:
            be.unstarted[cls] -= 1
        if entry is not None:
            self._note_start(be, key, entry, now)
        if be.paced and be.last_start > -math.inf:
            gap = now - be.last_start
            be.gap = gap if not be.num_gaps else be.gap + cfg.gap_weight * (gap - be.gap)
            be.num_gaps += 1
        if slot_wait == 0.0:  # sent with a free slot: the slot model's service
            fs = be.free_service
            for k in (cls, NUM_CLASSES):
                fs[k] = service_s if not fs[k] else fs[k] + cfg.service_weight * (service_s - fs[k])
        if slot_wait > 0.0:
            pass  # it waited for a slot: its service is the step after the slot (module doc)
        elif slot_wait == 0.0 or not ahead or be.num_gaps >= cfg.min_samples:
            if slot_wait == 0.0:
                ahead = 0  # a free slot: no queue ahead of it, whatever the class counts say
            residual = max(0.0, service_s - ahead * be.gap) if ahead else service_s
            own = residual  # its class's service
            if mark is not None and slot_wait != 0.0:
                # class-ordered (AdmissionConfig.class_ordered): the higher classes' requests
                # that started before it beyond those ahead of it at dispatch (sent after it,
                # they passed it), which the prediction projects: their time is not its
                # class's service. The all-class figure and the slopes' fit keep the residual
                # of the queue at dispatch (as they would measure it on any backend): fed
                # this one, the fit's slopes moved and the Fast predictions with them (Fast
                # prediction / actual p50 0.94 -> 1.38, one Fast request refused, simulated
                # 33B at 24.45 req/s, seed 2)
                passed = ahead + max(0, sum(be.started_n[:cls]) - mark)
                own = max(0.0, service_s - passed * be.gap)
            w = cfg.service_weight
            be.service = residual if be.service == 0.0 else be.service + w * (residual - be.service)
            cs = be.class_service[cls]
            if cs == 0.0:
                be.class_service[cls] = own
                be.class_u[cls], be.class_d[cls] = float(uncached), float(decoding)
            else:
                be.class_service[cls] = cs + w * (own - cs)
                be.class_u[cls] += w * (uncached - be.class_u[cls])
                be.class_d[cls] += w * (decoding - be.class_d[cls])
            be.fit.add(uncached, decoding, residual)
        be.last_start = now
        if self.overtaking:
            be.started_n[cls] += 1
        be.tick = max(be.tick, now)
        be.paced = any(be.unstarted)
        be.rate = be.rate * math.exp(-(now - be.rate_t) / cfg.rate_window_s) + 1.0
        be.rate_t = now

    def _calibrate(self, cls: int, error: float, now: float) -> None:
        e = self.errors[cls]
        e.append((now, error))
        self.num_errors[cls] += 1
        # the quantiles are re-read every 8th sample: a sort of <= 200 floats, not per arrival
        if self.num_errors[cls] % 8 == 0:
            self._quantiles(cls)

    def _quantiles(self, cls: int) -> None:
        if cls >= SLOT_POOLS:
            self._slot_quantiles(cls)
            return
        e = self.errors[cls]
        n = len(e)
        if n < self.config.calibration_min_samples:
            self.error_high[cls] = self.error_mid[cls] = 0.0
            return
        s = sorted(err for _, err in e)
        self.error_high[cls] = s[min(n - 1, int(self.config.calibration_quantile * n))]
        self.error_mid[cls] = s[n // 2]

    def _slot_quantiles(self, k: int) -> None:
        """A slot-model pool and its class's others: a pool short of samples takes the
        quantiles of its class's slot-model errors together (a Slow request admitted at 1.5x
        capacity is rare, so its long-wait pool seldom had 20 errors in 10 s, and Slow was
        admitted with no margin: 20-30 of 50-85 admitted missed in the simulator).
        `slot_fallback="shorter"`: of its class's pools of the same or a shorter predicted
        wait only, then of every class's (module doc, `AdmissionConfig.slot_fallback`)."""
        if self.config.slot_fallback == "shorter":
            self._slot_quantiles_shorter()
            return
        q, min_n = self.config.calibration_quantile, self.config.calibration_min_samples
        first = SLOT_POOLS + (k - SLOT_POOLS) // AHEAD_BUCKETS * AHEAD_BUCKETS
        pools = range(first, first + AHEAD_BUCKETS)
        merged = sorted(err for j in pools for _, err in self.errors[j])
        n_all = len(merged)
        for j in pools:
            e = self.errors[j]
            if len(e) >= min_n:
                s = sorted(err for _, err in e)
                self.error_high[j] = s[min(len(s) - 1, int(q * len(s)))]
                self.error_mid[j] = s[len(s) // 2]
            elif n_all >= min_n:
                self.error_high[j] = merged[min(n_all - 1, int(q * n_all))]
                self.error_mid[j] = merged[n_all // 2]
            else:
                self.error_high[j] = self.error_mid[j] = 0.0

    def _slot_quantiles_shorter(self) -> None:
        """Every slot-model pool: its own errors; short of samples, its class's pools of the
        same or a shorter predicted wait together; still short, every class's such pools."""
        q, min_n = self.config.calibration_quantile, self.config.calibration_min_samples
        errs = [[err for _, err in self.errors[SLOT_POOLS + j]]
                for j in range(NUM_CLASSES * AHEAD_BUCKETS)]
        for c in range(NUM_CLASSES):
            for bucket in range(AHEAD_BUCKETS):
                j = c * AHEAD_BUCKETS + bucket
                e = errs[j]
                if len(e) < min_n:
                    e = [x for b in range(bucket + 1) for x in errs[c * AHEAD_BUCKETS + b]]
                if len(e) < min_n:
                    e = [x for cc in range(NUM_CLASSES) for b in range(bucket + 1)
                         for x in errs[cc * AHEAD_BUCKETS + b]]
                k = SLOT_POOLS + j
                if len(e) >= min_n:
                    e = sorted(e)
                    self.error_high[k] = e[min(len(e) - 1, int(q * len(e)))]
                    self.error_mid[k] = e[len(e) // 2]
                else:
                    self.error_high[k] = self.error_mid[k] = 0.0

    def expire(self, now: float) -> None:
        """Drop calibration errors older than the horizon (module doc)."""
        horizon = now - self.config.calibration_horizon_s
        for cls, e in enumerate(self.errors):
            if e and e[0][0] < horizon:
                while e and e[0][0] < horizon:
                    e.popleft()
                self._quantiles(cls)

    def pool_at(self, cls: int, b: int) -> int:
        """The calibration pool of a class-`cls` request sent to `b` now."""
        be = self.backends.get(b)
        if be is None:
            return pool(cls, 0)
        if self.clock is not None and be.step:
            w = self._slot_wait(be, cls, 0, self.clock())
            if w is not None:
                return slot_pool(cls, w, be.step)
        return pool(cls, sum(be.unstarted[: cls + 1]))

    def calibrated(self, cls: int, predicted_s: float, b: int = -1) -> float:
        """The point estimate of a class-`cls` wait predicted at `predicted_s` on `b`
        (Retry-After)."""
        return max(0.0, predicted_s + self.retry_after_error(self.pool_at(cls, b)))

    def retry_after_error(self, k: int) -> float:
        """What a Retry-After adds to a prediction of calibration pool `k` (module doc;
        `AdmissionConfig.retry_after_calibrated`)."""
        on = self.config.retry_after_calibrated
        if on is None:
            on = k < SLOT_POOLS
        return self.error_mid[k] if on else 0.0

    def gone(self, b: int, cls: int, key=None) -> None:
        """A request sent to `b` left before its first token (error, abort, refusal)."""
        be = self.backends.get(b)
        if be is not None and be.unstarted[cls] > 0:
            be.unstarted[cls] -= 1
        if be is not None and key is not None:
            be.queued.pop(key, None)
            be.marks.pop(key, None)

    def finished(self, b: int, key, now: float, num_tokens: int) -> None:
        """A started request on `b` ended at `now` after `num_tokens` output tokens (0: it
        ended otherwise, an error or an abort): its slot is free, and its tokens measure the
        step time."""
        be = self.backends.get(b)
        if be is None:
            return
        entry = be.running.pop(key, None)
        be.tick = max(be.tick, now)
        if entry is not None:
            be.ended.append(now)
        if entry is None or num_tokens < 2:
            return
        itl = (now - entry[0]) / (num_tokens - 1)
        if itl > 0.0:
            w = self.config.service_weight
            be.step = itl if not be.num_steps else be.step + w * (itl - be.step)
            be.num_steps += 1
            # every backend's steps together: the step of a backend not measured yet
            self.fleet_step = itl if not self.fleet_step else self.fleet_step + w * (itl - self.fleet_step)
            borrowing = self._borrowing
            if borrowing:
                borrowing.discard(b)
                if self.config.fleet_step:
                    for other in borrowing:
                        self.backends[other].step = self.fleet_step

    # ---- the slot model (module doc) ---------------------------------------------------------
    def _note_start(self, be: _Backend, key, entry: tuple, now: float) -> None:
        """A tracked request started: it holds a slot; while others sent before it wait for
        more than two steps, the backend is full, and what runs there is its concurrency."""
        if entry[1] > 1:
            be.running[key] = (now, entry[1])
        step = be.step
        if not step:
            return
        late = now - 2.0 * step
        if any(q[2] < late for q in be.queued.values()):
            # what ran in the step that ends now: the running requests, those ending in it
            # (read before or after this start) among them, and this one
            horizon = now - 0.5 * step
            n = (sum(1 for t0, mt in be.running.values() if t0 + (mt - 1) * step > horizon)
                 + sum(1 for t in be.ended if t > horizon)
                 + (entry[1] <= 1))  # a one-token request held its slot for its step
            self._seen_full(be, n)

    @staticmethod
    def _seen_full(be: _Backend, n: int) -> None:
        """`n` requests ran on `be` while others waited there: the concurrency seen, which
        replaces a reported max_num_seqs, at most it (`set_slots`)."""
        be.seen_slots = max(be.seen_slots, n)
        r = be.reported_slots
        be.slots = min(be.seen_slots, r) if r else be.seen_slots

    def _live_finishes(self, be: _Backend, now: float) -> list[float]:
        """When each running request is expected to send its last token (first token time
        + (max_tokens - 1) steps), leaving out those due within half a step of `now` (they
        finish in the step that ends now; the owner may read their first and last tokens in
        either order). Upper bounds where a stop token may end a request sooner."""
        step = be.step
        horizon = now + 0.5 * step
        out = []
        for t0, mt in be.running.values():
            t = t0 + (mt - 1) * step
            if t > horizon:
                out.append(t)
        return out

    def higher_rate(self, be: _Backend, cls: int, now: float) -> tuple[float, float]:
        """(requests/s of the classes above `cls` recently sent to `be`, their mean
        max_tokens): what the slot model expects to take slots ahead of a waiting request.
        `AdmissionConfig.fleet_arrival_rate`: every backend's, averaged."""
        if self.config.fleet_arrival_rate and len(self.backends) > 1:
            rs = [self._higher_rate(b2, cls, now) for b2 in self.backends.values()]
            total = sum(r for r, _ in rs)
            if total <= 0.0:
                return 0.0, 0.0
            return total / len(rs), sum(r * m for r, m in rs) / total
        return self._higher_rate(be, cls, now)

    def _higher_rate(self, be: _Backend, cls: int, now: float) -> tuple[float, float]:
        window = self.config.arrival_window_s or self.config.rate_window_s
        decay = math.exp(-max(0.0, now - be.arr_t) / window)
        # the decayed count over the time it has been counting: a window longer than the
        # backend's life would read a rate too low (AdmissionConfig.rate_from_start; a longer
        # arrival_window_s always); over RATE_MIN_SPAN_S at least (the first window's requests,
        # placed at once, are not a rate of hundreds a second)
        seen = max(RATE_MIN_SPAN_S, now - be.arr_t0) if be.arr_t0 is not None else 0.0
        span = (window * -math.expm1(-seen / window)
                if (self.config.arrival_window_s or self.config.rate_from_start) and seen > 0.0
                else window)
        rate_h = sum(be.arr_rate[:cls]) * decay / span
        mt_h = (sum(r * m for r, m in zip(be.arr_rate[:cls], be.arr_mt[:cls]))
                / sum(be.arr_rate[:cls])) if rate_h > 0.0 else 0.0
        return rate_h, mt_h

    def _slot_wait(self, be: _Backend, cls: int, extra_ahead: int, now: float,
                   quantile: float | None = None, send_in: float = 0.0) -> float | None:
        """How long a class-`cls` request sent to `be` now waits for a slot (None: the model
        has no step time or concurrency yet). `quantile`: an upper quantile of the wait over
        the higher classes' arrivals instead of their mean projection
        (`AdmissionConfig.arrival_quantile_mode`: over sampled futures, or a Poisson count's
        quantile at every time)."""
        if not self.config.slot_model or not be.step:
            return None
        step = be.step
        finishes = self._live_finishes(be, now)
        queued = list(be.queued.values())
        slots = be.slots if self.config.reported_slots else be.seen_slots
        if not slots:
            # not reported, not measured at a start yet: a request sent more than two steps
            # ago and still waiting says the backend is full now, with what runs there
            late = now - 2.0 * step
            if not any(q[2] < late for q in queued):
                return None
            self._seen_full(be, len(finishes))
            slots = be.slots if self.config.reported_slots else be.seen_slots
            if not slots:
                return None
        # the free slots go to what was sent before it, whatever the class (it is there first);
        # the slots that free later, to the requests of its class or a higher one first
        free = max(0, slots - len(finishes))
        spare = free - len(queued) - extra_ahead  # free slots left after those sent before it
        if spare > 0:
            if quantile is None or not self.config.compete_steps:
                return 0.0
            return self._contested_wait(be, cls, now, quantile, finishes, queued, extra_ahead,
                                        spare, slots, send_in)
        heap = finishes
        for q in queued[:free]:
            heap.append(now + q[1] * step)
        heapq.heapify(heap)
        if not heap:
            return None
        # waiting there: the higher classes' requests first, then its own class's (each in the
        # order sent; window mates placed before it count as its class's)
        rest = queued[free:]
        ahead = [q[1] for q in rest if q[0] < cls] + [q[1] for q in rest if q[0] == cls]
        n_high = sum(1 for q in rest if q[0] < cls)
        n_ahead = len(ahead) + max(0, extra_ahead - max(0, free - len(queued)))
        # each takes a slot in turn for its max_tokens steps; the higher classes' requests
        # expected meanwhile (their recent rate here) take theirs after the higher classes'
        # waiting ones and before its own class's
        if ahead:
            mean_mt = sum(ahead) / len(ahead)
        else:
            mean_mt = sum(mt for _, mt in be.running.values()) / len(be.running) if be.running else 1.0
        rate_h, mt_h = self.higher_rate(be, cls, now)
        run = (heap, ahead, n_high, n_ahead, mean_mt, rate_h, mt_h, step, slots)
        if quantile is None or not rate_h:
            return self._slot_run(run, now, MEAN_ARRIVALS)
        if self.config.arrival_quantile_mode == "path":
            return self._slot_run(run, now, poisson_thresholds(quantile))
        # "sampled": the q-quantile of the waits over fixed unit-rate Poisson futures
        paths = sampled_arrivals(self.config.arrival_samples, self.config.max_arrivals_sim)
        waits = sorted(self._slot_run(run, now, u) for u in paths)
        return waits[min(len(waits) - 1, int(quantile * len(waits)))]

    def _contested_wait(self, be: _Backend, cls: int, now: float, quantile: float,
                        finishes: list[float], queued: list, extra_ahead: int,
                        spare: int, slots: int, send_in: float = 0.0) -> float:
        """`_slot_wait` at an upper quantile `q` of the higher classes' arrivals when `spare`
        slots are free for it (`AdmissionConfig.compete_steps`): the higher classes' requests
        arriving within `compete_steps` steps take the spare slots before it (the backend
        admits at its next step, Fast first). They do with probability p = P(N >= spare), N
        Poisson with mean rate x window; where they do, it waits for the next slot to free
        that no later higher-class arrival takes. Its wait's q-quantile: 0 while p <= 1 - q,
        else the (1 - (1 - q) / p)-quantile of the wait given that it lost them (the futures
        of `_slot_wait`, each after `spare` arrivals that took the free slots). `send_in`: how
        long it waits in its batching window first (`AdmissionConfig.compete_window`)."""
        rate_h, mt_h = self.higher_rate(be, cls, now)
        if not rate_h:
            return 0.0
        cfg = self.config
        step = be.step
        window = cfg.compete_steps * step
        lead = send_in if cfg.compete_window else 0.0
        if cfg.compete_phase and be.tick > -math.inf:
            # the next step starts at the first step end after its send (steps back to back)
            window = min(window, step - math.fmod(max(0.0, now + lead - be.tick), step))
        window += lead  # its window's arrivals go out with it (or before), Fast first
        m = rate_h * window  # expected arrivals in the window
        term = cdf = math.exp(-m)
        for j in range(1, spare):
            term *= m / j
            cdf += term
        p_lose = 1.0 - cdf
        if p_lose <= 1.0 - quantile:
            return 0.0
        level = 1.0 - (1.0 - quantile) / p_lose
        if cfg.arrival_quantile_mode == "path":
            futures: Sequence[Sequence[float]] = (poisson_thresholds(level),)
        else:
            futures = sampled_arrivals(cfg.arrival_samples, cfg.max_arrivals_sim)
        heap0 = list(finishes)
        for q in queued:
            heap0.append(now + q[1] * step)
        if extra_ahead:  # window mates placed before it take free slots too
            mean_run = (sum(mt for _, mt in be.running.values()) / len(be.running)
                        if be.running else 1.0)
            heap0.extend([now + mean_run * step] * extra_ahead)
        # the `spare` arrivals took the free slots (from the next step, for their max_tokens
        # steps); each future's arrivals after them take the slots that free before it gets one
        heap0.extend([now + (1.0 + mt_h) * step] * spare)
        heapq.heapify(heap0)
        if cfg.compete_elsewhere and self._spare_elsewhere(be, now):
            # another backend has a free slot: the later arrivals are placed there, and the
            # next slot to free here is its
            return max(0.0, heap0[0] - now)
        run = (heap0, [], 0, 0, 1.0, rate_h, mt_h, step, slots)
        waits = sorted(self._slot_run(run, now, u) for u in futures)
        return waits[min(len(waits) - 1, int(level * len(waits)))]

    def _spare_elsewhere(self, be: _Backend, now: float) -> bool:
        """Whether a backend other than `be` has a slot free for a request sent now."""
        for other in self.backends.values():
            if other is be or not other.step or not other.slots:
                continue
            if other.slots - len(self._live_finishes(other, now)) > len(other.queued):
                return True
        return False

    def _slot_run(self, run: tuple, now: float, thresholds: Sequence[float]) -> float:
        """`_slot_wait`'s event simulation: the k+1-th higher-class arrival expected at
        now + thresholds[k] / rate (the mean: k + 1)."""
        heap0, ahead, n_high, n_ahead, mean_mt, rate_h, mt_h, step, slots = run
        heap = list(heap0)
        # each takes a slot in turn for its max_tokens steps; the higher classes' requests
        # expected meanwhile (their recent rate here) take theirs after the higher classes'
        # waiting ones and before its own class's
        # (projected over arrival_horizon_s at most: past that, a rate measured over the last
        # rate_window_s says nothing)
        cfg = self.config
        horizon = now + cfg.arrival_horizon_s
        n_sim = min(n_ahead, cfg.max_slot_sim)
        n_thr = len(thresholds)
        taken = arrived = 0
        capped = True
        for _ in range(n_sim + cfg.max_arrivals_sim):
            t = max(heap[0], now)
            if taken < min(n_high, n_sim):
                mt = ahead[taken]
                taken += 1
            elif rate_h and arrived < n_thr and rate_h * (min(t, horizon) - now) >= thresholds[arrived]:
                mt = mt_h
                arrived += 1
            elif taken < n_sim:
                mt = ahead[taken] if taken < len(ahead) else mean_mt
                taken += 1
            else:
                capped = False
                break
            heapq.heapreplace(heap, t + mt * step)
        t = max(heap[0], now)
        if capped:  # past what was simulated: one slot turn each at the slots' pace
            left = n_ahead - taken + max(0.0, rate_h * (horizon - now) - arrived)
            t += left * max(mean_mt, mt_h) * step / max(1, slots)
        return min(cfg.max_wait_s, max(0.0, t - now))

    # ---- predictions -----------------------------------------------------------------------
    def known(self, b: int) -> bool:
        be = self.backends.get(b)
        return be is not None and be.num_gaps >= self.config.min_samples

    def capacity(self, b: int) -> float:
        """Starts per second `b` sustains under load (0 until measured)."""
        be = self.backends.get(b)
        if be is None or be.num_gaps < self.config.min_samples or be.gap <= 0:
            return 0.0
        return 1.0 / be.gap

    def backend_ttft(self, b: int, cls: int, uncached: int | None = None,
                     extra_ahead: int = 0, decoding: int | None = None,
                     quantile: float | None = None, send_in: float = 0.0) -> float:
        """Predicted dispatch -> first token of a class-`cls` request sent to `b` now, with
        `uncached` prompt tokens to prefill there (None: the class's mean), `extra_ahead`
        more requests ahead than were dispatched (placed earlier in the same window) and
        `decoding` sequences decoding there (None: `decoding(b)`); `quantile`: the slot
        model's higher-class arrivals at that Poisson quantile (`_slot_wait`)."""
        be = self.backends[b]
        service = self._service(be, cls, uncached, b, decoding)
        if self.clock is not None and be.step:
            w = self._slot_wait(be, cls, extra_ahead, self.clock(), quantile, send_in)
            if w is not None:
                return self.slot_ttft(b, cls, w)
        if be.num_gaps < self.config.min_samples:
            return service
        wait = (sum(be.unstarted[: cls + 1]) + extra_ahead) * be.gap
        if self.overtaking and cls and wait > 0.0:
            wait = self.overtaken_wait(be, cls, wait)
        return wait + service

    def overtaken_wait(self, be: _Backend, cls: int, wait: float) -> float:
        """The wait of a class-`cls` request with `wait` = ahead x gap of work of its class or a
        higher one ahead of it, on a backend that admits by class: the higher classes' requests
        that arrive meanwhile (their recent rate there, `higher_rate`) start before it too,
        one gap each: W = wait + rate_h x gap x W, so W = wait / (1 - rate_h x gap) (module
        doc, "Overtaking"); over `overtake_horizon_s` at most (their arrivals past it not
        projected); `max_wait_s` where they alone fill the backend (rate_h x gap >= 1)."""
        cfg = self.config
        if self.clock is None:
            return wait
        rate_h, _ = self.higher_rate(be, cls, self.clock())
        rho = rate_h * be.gap
        horizon = cfg.overtake_horizon_s
        if rho < 1.0:
            w = wait / (1.0 - rho)
            if horizon is None or w <= horizon:
                return min(cfg.max_wait_s, w)
        elif horizon is None:
            return cfg.max_wait_s
        return min(cfg.max_wait_s, wait + rho * horizon)

    def slot_ttft(self, b: int, cls: int, wait: float) -> float:
        """Dispatch -> first token of a class-`cls` request on `b` that waits `wait` for a
        slot: a free slot (0), the step in progress and its own (measured from the starts sent
        with a free slot; 1.5 steps until one is); a slot freed at a step's end: admitted in
        the next step, its first token at that step's end."""
        be = self.backends[b]
        fs = be.free_service
        free = fs[cls] or fs[NUM_CLASSES] or 1.5 * be.step
        return free if wait <= 0.0 else wait + be.step + max(0.0, free - 1.5 * be.step)

    def slot_retry_after(self, b: int, cls: int, window_s: float,
                         quantile: float | None) -> float | None:
        """A class-`cls` request's Retry-After on `b` (`AdmissionConfig.retry_after_quantile`):
        its batching window, then the `quantile` of its dispatch -> first token over the
        admission check's futures (None: the mean projection's; returns None where the slot
        model does not predict on `b`)."""
        be = self.backends.get(b)
        if be is None or self.clock is None or not be.step:
            return None
        w = self._slot_wait(be, cls, 0, self.clock(), quantile, window_s)
        if w is None:
            return None
        return window_s + self.slot_ttft(b, cls, w)

    def _service(self, be: _Backend, cls: int, uncached: int | None, b: int,
                 decoding: int | None) -> float:
        fit = be.fit
        cs = be.class_service[cls]
        if not cs:
            return be.service
        if not (fit.k_u or fit.k_d):
            return cs
        s = cs
        if uncached is not None:
            s += fit.k_u * (uncached - be.class_u[cls])
        if fit.k_d and (decoding is not None or self.inflight is not None):
            s += fit.k_d * ((self.decoding(b) if decoding is None else decoding) - be.class_d[cls])
        return max(0.0, s)

    def predict(self, cls: int, gateway_ahead: int, window_s: float,
                live: Iterable[int] | None = None) -> tuple[float, int]:
        """(predicted TTFT in seconds, the backend it would best go to; (window_s, -1) with no
        backend). Backends at their in-flight cap count too: the gateway holds the request
        until one has room, which is part of the wait predicted. `live`: the backends to consider
        (the gateway's healthy ones; None: every backend seen). Its prompt's prefill counts as
        its class's mean: where it goes, and so what is cached, is decided at the flush."""
        best, best_t = -1, math.inf
        total_capacity = 0.0
        for b in self.backends if live is None else live:
            if b not in self.backends:
                continue
            t = self.backend_ttft(b, cls)
            if t < best_t:
                best, best_t = b, t
            total_capacity += self.capacity(b)
        if best < 0:
            return window_s, -1
        queued = gateway_ahead / total_capacity if gateway_ahead and total_capacity else 0.0
        return window_s + queued + best_t, best

    def recent_rate(self, b: int, now: float) -> float:
        be = self.backends[b]
        w = self.config.rate_window_s
        return be.rate * math.exp(-max(0.0, now - be.rate_t) / w) / w

    def headroom(self, now: float) -> dict[int, float]:
        """Per backend: capacity minus the recent start rate, requests/s (0 until measured)."""
        return {b: max(0.0, self.capacity(b) - self.recent_rate(b, now)) if self.known(b) else 0.0
                for b in self.backends}


class AdmissionControl:
    """The admission rule over a `WaitPredictor`: refuse a request whose predicted TTFT passes
    its deadline. `check` is what the gateway's dispatcher and the simulator's gateway call."""

    def __init__(self, config: AdmissionConfig = AdmissionConfig(),
                 predictor: WaitPredictor | None = None) -> None:
        self.config = config
        self.predictor = predictor or WaitPredictor(config)
        self.num_refused = [0] * NUM_CLASSES
        self.num_admitted = [0] * NUM_CLASSES
        # the last check's predicted TTFT and calibration margin (s; None: no deadline), which
        # the decision logs record beside each arrival (simulator vs live, input by input)
        self.last_predicted_s: float | None = None
        self.last_margin_s = 0.0

    def check(self, cls: int, gateway_depths: list[int] | tuple[int, ...], window_s: float,
              ttft_override_ms: float | None = None, live: Iterable[int] | None = None,
              now: float | None = None) -> Refusal | None:
        """None to admit; a Refusal (with the predicted TTFT) to answer 429 now.
        `gateway_depths`: requests queued in the gateway per class; `window_s`: how long the
        batching window would hold this request (`DynamicWindowBatcher.predicted_wait`)."""
        deadline = self.config.slo.ttft_s(cls, ttft_override_ms)
        if deadline is None:
            self.num_admitted[cls] += 1
            self.last_predicted_s = None
            return None
        pred = self.predictor
        if now is not None:
            pred.expire(now)
        ttft, b = pred.predict(cls, sum(gateway_depths[: cls + 1]), window_s, live)
        k = pred.pool_at(cls, b)
        margin = pred.error_high[k]
        q = self.config.arrival_quantile
        if cls == 1 and self.config.normal_overtake_quantile is not None:
            q = self.config.normal_overtake_quantile  # Normal's own (its Fast overtakers)
        elif cls < self.config.arrival_quantile_from:
            q = None
        if q is not None and b >= 0 and ttft + margin <= deadline:
            # admitted only if its wait's upper quantile over the higher classes' arrivals
            # after it meets the deadline too (AdmissionConfig.arrival_quantile); the
            # Retry-After stays the point estimate
            margin += max(0.0, pred.backend_ttft(b, cls, quantile=q, send_in=window_s)
                          - pred.backend_ttft(b, cls))
        self.last_predicted_s, self.last_margin_s = ttft, margin
        if ttft + margin > deadline:
            self.num_refused[cls] += 1
            ra = None
            if self.config.retry_after_quantile is not None and b >= 0:
                ra = pred.slot_retry_after(b, cls, window_s, self.config.retry_after_quantile)
            if ra is None:  # the point estimate (the gap model's always)
                ra = ttft
            return Refusal(cls, max(0.0, ra + pred.retry_after_error(k)), deadline)
        self.num_admitted[cls] += 1
        return None
