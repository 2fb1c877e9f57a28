"""Measured cost model: step times from a `tidegate backend profile` JSON, interpolated.

Model: a non-negative least-squares fit ``t = a + b·d + c·p + e·ctx + f·Σp_i²`` over the measured
points (d decode seqs, p = Σp_i prefill tokens over the step's prefill chunks, ctx context tokens),
plus a piecewise-linear interpolation of its residuals inside the convex hull of the points (scipy
`LinearNDInterpolator`), so the model is exact at measured points and extrapolates linearly outside
them. Calls are memoized on (d, p, ctx rounded to `ctx_quantum`, the prefill chunks' shape), so the
event loop pays a dict lookup per step.

Packed and cached-prefix prefills: a profile point may carry `num_prefill_seqs` k (its p tokens are
k chunks of p/k each) and `prefill_context_len` s (each chunk starts at position s); old profiles
have neither (k = 1 when p > 0, s = 0). Attention within the chunks costs Σp_i² (not p²: k short
prompts packed in one step are not one long prompt), attention of the chunks over their cached
prefixes Σp_i·s_i. When the profile measured k > 1, a per-prefill-sequence term g·k joins the fit
(and k-space joins the residual interpolation as Σp_i²); when it measured s > 0, a term h·Σp_i·s_i.
A profile without those points fits and interpolates exactly as before.

CUDA-graph padding: on CUDA the engine runs a step holding prefill tokens as the captured graph of
the smallest token bucket >= its d + p tokens (`backend.runner.cuda_graphs`); the pad tokens go through
every matrix product as a prefill token does, and through no attention. When the profile names its
buckets (`cuda_graph_token_buckets`, written by `backend profile`; profiles measured on CUDA before
that get `LEGACY_CUDA_TOKEN_BUCKETS`, the engine's defaults then), the prefill-token term is charged
for p + pad, so a step is charged for the bucket it runs as. Without that a 2 x 512-token step plus
16 decodes (bucket 1,280) was predicted 112 ms against 129-133 measured: the Σp_i² term had taken
up the buckets' steps as if they were attention, and a packed step "saved" most of it.

Host launch: a point's step time is wall time from the host's launch to the tokens read back; the
engine's async loop launches a step while the one before it still runs, so back to back a step
costs its device part alone. When the profile has `launch_ms_median` per point and the model is
built with `hide_launch=True` (the async loop: `sims.event_loop.EngineConfig.async_plan_lead_s`),
the fit is of step time minus launch time, and `launch_time(d, p)` (a least-squares line in d and
p over the points' launch times) is what a step starting on an idle engine adds. On the H200 the
profile's decode steps were 2.5% over the live ones by that launch (0.53 ms of ~20).
Device time (issue 35, session 17): step time minus launch time is what a back-to-back step costs
only if the device did nothing while the host launched. Profiles since session 17 also time each
point as the serving loop runs it, queued behind device work (`backend profile --device-time on`:
a spin kernel holds the stream while the host launches, so the step's own ops run back to back),
with the CUDA events the live step log reads (`device_ms_median`: from the step's start event,
before its input copies, to its read-back). With every point carrying it and `hide_launch`, the
fit is of those device times (`fits_device_time`); `launch_time` is unchanged. Why: on the H200's
6.7B FP8 part (session 16) the live decode steps of 33-64 sequences ran 2.7-3.2% over the
profile's step minus launch at the same shapes and its mixed steps 1.8% over, where decode steps
of <= 32 sequences matched within 0.5% and the clock sat at 1,980 MHz (no power cap): the
profile's wall time cannot tell a launch the device waited through from one it ran beside.
Profiles without the field fit step minus launch as before.

Power cap (opt-in, `power_cap=True`; needs the profile's `pause_check`): on the H200 a
compute-bound step runs slower when compute-bound steps filled the time just before it (the
software power cap lowers the clock within a step's time). The pause check measures two duty
points of one prefill step: after a `pause_ms` idle (prefill busy for a fraction f_ref = 1 -
pause / W of the window W = `POWER_CAP_WINDOW_S` before it) and back to back (f = 1), slower by r.
(Profiles since issue 35's session 14 also time the step after a second of it back to back, the
"sustained" run: r is the slower of the two, the back-to-back run lasting only ten steps, 63 ms on
the 6.7B, where it read 0.91 x paused while live steps under sustained load ran 6% slow.)
`prefill_slowdown(f)` = 1 + (r - 1)·max(0, f - f_ref) / (1 - f_ref), applied by the event loop to a
step with prefill tokens, f being the prefill-busy share of the W before it. The profile's points
were measured paused (f_ref), so at f <= f_ref nothing changes. Live on the H200 (33B, 2026-12-03)
prefill steps ran 1.005 / 1.040 / 1.05-1.09 x the profile at f = 0 / 0.5 / 1 over 100 ms; this
model, from the pause check alone, gives 1.0 / 1.018 / 1.106.
Decode-busy time counts too (issue 35): live prefill steps with no prefill in the 100 ms before
them, but decode steps, ran ~3% over the paused profile. Profiles whose pause check has the
"after_decode" run (the pause filled with decode steps) add (r_dec - 1)·g, g being the decode-only
share of the window, r_dec from that run alone; older profiles have r_dec = 1.
The cap slows a step by its compute, not by its kind (issue 35, the H200 grid's 33B part, with the
engine's 256-token prefill cap while decoding): the pause check times one 512-token prefill-only
step, 72% of whose fitted time is past the fit's constant (the weights' read, paid by every step);
a capped mixed step (a 256-token chunk beside the decodes) has ~60%, a decode-only step ~30%. The
cap lowers the SM clock (1,965 MHz median in decode-only windows, 1,605 in windows of mixed steps,
1,500 with 512-token prefills: nvidia-smi every 100 ms) and leaves the memory clock, so with
`cap_by_compute` (the default) every step — decode-only ones too — is slowed by the factor's
excess over 1 times its `compute_share` over the pause check step's. Live, 11,574 steps: prefill
steps with f >= 0.5 ran 1.10x the paused profile (the factor alike gave 1.131 at f = 1: 3.3%
over), decode-only steps right after one 1.03x (not modelled before: 3.2% under); by compute share
every bin is within 2.5% (BENCHMARKS, issue 35, 2026-12-04). `cap_by_compute=False`: the model
before (every step with prefill slowed alike, decode-only steps not).

Decode-graph buckets (issue 35, session 15): on CUDA a decode-only step of d sequences runs the
decode graph of the smallest bucket >= d (`cuda_graph_decode_buckets`: 1, 2, 4, 8, 16, 24, 32, 48,
64, ...), so its time jumps past each bucket (live 6.7B: d 16 -> 17 5.51 -> 5.95 ms, 48 -> 50 7.94 ->
8.41) and rises with d inside it. When the profile names the buckets and measured a decode point at
a bucket's first batch (the previous bucket + 1: 3, 5, 9, 17, 25, 33, 49; `backend profile
--decode-bucket-points on`), the decode-only residuals are interpolated inside each bucket's own
batches [previous + 1, bucket] only, never across a bucket's edge: a step is charged its bucket's
level, rising inside it as measured. Profiles without such a point interpolate as before.

Sustained load (issue 35, session 15): profiles whose pause check's "sustained" run carries its
trace (`trace_t_ms`, `trace_ms`: every step's start and time from an idle engine through the
sustained period back to back) fit it as T(t) = A + B (1 - exp(-t / tau)) (`fit_sustained_trace`):
tau is how fast the power limiter follows the load, (A + B) / paused the fully busy ratio r. The
model then reads the busy shares as exponential averages with that tau (`power_cap_tau_s`; the
event loop weights each earlier prefill / decode span by exp(-age / tau) instead of a 100 ms
window), and f_ref is the average the paused points ran at (a step s, a pause P: (1 - e^-s/tau)
e^-P/tau / (1 - e^-(s+P)/tau)); the factor's form is unchanged. Profiles without the trace: the
100 ms window as before.

Power by step kind (issue 35, session 16): the limiter holds the board's POWER (nvidia-smi: the SW
power cap flag set in every throttled sample, the draw pinned at ~685-690 W), so how far it lowers
the clock depends on how much power the recent work draws at full clock, not on the share of time in
steps that carry any prefill token. The 512-token prefill-only step of the pause check is the most
power-hungry kind; the capped engine's mixed step (a 256-token chunk beside the decodes) draws less,
by a margin that differs by model and format: live at a full prefill-busy share the H200 ran the
33B FP8's mixed steps at 1,800 MHz (0.99 x the paused profile) where the sustained prefill-only run
settled at 1,605 (1.12 x), the 33B bf16's at ~1,530 (1.09-1.11 x against 1.11-1.13). The compute
share does not tell them apart (33B FP8: 0.60 mixed, 0.61 the 512-token step). Profiles whose pause
check has the "sustained_mixed" run (the mixed step of d decodes of context c beside a p-token
chunk, paused and then back to back, traced as "sustained"; `backend profile`, issue 35 session 16)
give r_mix = sustained / paused; with `cap_by_power` (opt-in) each step with prefill weighs
in the busy share f by its kind's power: the mixed step by w_mix, the busy share at which the
factor gives r_mix (w_mix = f_ref + (1 - f_ref)(r_mix - 1) s_ref / ((r - 1) s_mix), s the compute
shares; f_ref where r_mix <= 1), the pause check's step by 1, any other by its token rate (tokens /
its time, over the pause check step's: the rate of its matrix products, which their power follows)
interpolated linearly through (0, 0), the mixed step's and (1, 1), held past the end
(`cap_weight`). The decode-only share g and the factor's form are unchanged; profiles without
the run, or the model without `cap_by_power`, weigh every step with prefill 1, as before. Opt-in
because the what-if (the run stood in by live steps, bench/results/fidelity_cost_s16) moved the
33B FP8 part's TPOT P50 from +2.5 / +5.5 / +21.5 / +32.8% to -0.1 / -4.3 / -3.0 / +13.5% at
0.5 / 0.8 / 0.95 / 1.2x but the 6.7B's TTFT P50 from -5.5 / -6.0 / -2.7 / -8.0% to -6.2 / -8.3 /
-9.0 / -9.8% (its TPOT stays inside 5%): the profile has not measured the run yet. Still opt-in
here; since session 25 the fidelity tools (`bench.simulator.validate.model_terms`, `validate_replay`)
turn it on wherever the profile measured the run: on every such H200 grid part it brought more
cells inside the bound, never fewer (bench/results/fidelity_grid_h200_s25).
The packed anchor (issue 35, session 18): with the two runs above, the grid's ~2,000-token packed
prefill steps (the largest the engine runs) sit past the pause check step's token rate and were
weighed by holding its weight, 1; live they draw the most power of any step (33B FP8: SM clock 1,642
MHz median inside them against 1,860 in the mixed steps; the 6.7B FP8's, 0.86-0.95 of live, ran at
1,965: their error there is their shape, not the cap; bench/results/fidelity_packed_s18).
Profiles whose pause check has the "sustained_packed" run (that step, k prompts of p / k tokens,
paused then back to back, as "sustained_mixed") give r_packed = sustained / paused, a third anchor:
w_packed by the same rule as w_mix (above 1 where it throttles more than the 512-token step: the
factor continues its line), placed at its token rate; weights are piecewise linear in token rate
through every anchor, held past the last. Why token rate and a line through the anchors: the
existing model's assumption (power follows the rate of the matrix products; the limiter holds
power, so a kind's slowdown follows its power), with no parameter beyond the measured ratios.
Where the 512-token step does not throttle (r <= 1, the factor flat: no weight gives any
slowdown) but the packed one does, the packed step is the factor's reference (r = r_packed, tau
from its trace, f_ref its paused duty; the 512-token and mixed steps weigh f_ref if they do not
slow down). Profiles without the run are charged exactly as before (the committed ones:
bench/results/fidelity_packed_s18/identity.py).

Decode spells (issue 35, session 20): with `cap_by_power` a step with prefill counts the busy
engine's decode-only time before it (g, the same exponential share) at its own weight:
f = Σ w_i·(prefill spans) + w_step·g. Why: the limiter holds the board's power over a spell longer
than a step, and a busy engine's decode steps (600-680 W live on the 33B) leave it no headroom, so a
step drawing more than the cap throttles at once whatever ran before it. The nvidia-smi samples that
fell inside the live steps (session 20's H200 parts) put the 33B bf16's 256-token mixed steps at
1,650-1,700 MHz at every batch (1-8 decodes: 1,695-1,702; the sustained mixed run settled at 1,515
-1,710) while the samples between them, in its decode steps, read 1,950-1,980, and the prefill share
before the small-batch ones was only 0.34-0.39: the busy-share factor charged them ~1.00-1.03 where
live they ran 1.07 over the paused profile (int4-fp8 KV: model / live 0.93 at 1-8 decodes, 0.95 at
9-32). Decode-only steps keep their factor (their clock stayed at 1,950-1,980 at <= 32 decodes).
A step whose kind does not throttle (the 6.7B's mixed steps, w at the paused share: their clock
1,965-1,980 live) is unchanged; without `cap_by_power` (weights 1) nothing changes: counting every
decode spell as a 512-token prefill over-charged the 33B bf16's and the 6.7B's uniform parts
(bench/results/fidelity_grid_h200_s20, "decode spells").

The delayed onset (issue 35, session 41; opt-in, `cap_onset="delay"`, `validate_replay --cap-onset delay`): on the
H100 the live busy steps with prefill come in runs back to back (on the 6.7B bf16 2.7 steps on average at 0.5x, 5-7
at 0.95x), and their level over the paused profile is set by their place in the run, the same at every load: the
first four places of the 6.7B's (~55 ms) at the paused level, the later ones 1.5-2.5 % over; the 33B's 1.05 at the
second place and 1.09-1.10 from the third (bench/results/pairs_s41, README section 7). The load only makes the runs
longer. The card's own sustained trace shows the delay: its 512-token step back to back from idle runs ~1.02 x its
paused device time for the first 80 ms on the 6.7B, then 1.09-1.10. And the late places' level is the "stream_kind"
mixed run's ratio (6.7B 1.022, 33B 1.098, live 1.021-1.025 / 1.096-1.108). So with "delay" a step with prefill pays
1 + (r_stream - 1) x (its compute share / the stream run's step's) for the part of it that runs after the run of
steps with prefill it belongs to has lasted the delay D, and before that the busy level (below: the sustained_mixed
step's no-pause over paused device time; 1 after an idle spell or where unmeasured: 1.041 on the 33B bf16, ~1.00 on
the 6.7B, where the run's first step after a short decode spell reads 1.02-1.045 live on the 33B); a decode-only
step, or an idle spell, ends the run; decode-only steps pay nothing. D is the start of the first step of the "sustained" trace (device
time, over the "stream_kind" prefill run's paused device time of the same step) past halfway from its first two
steps' level to its settled half's; r_stream the "stream_kind" mixed run's ratio. None of the other cap terms apply
(the busy shares, the spells, the busy level). Profiles without the device trace or those runs (every H200 profile
so far), or whose trace does not rise, keep the default cap. Scored on the H100 parts' live steps
(`pairs_s41/delay_whatif.py`): the steps with prefill per run 0.994-1.000 (6.7B bf16) and 0.992-0.999 (33B bf16) of
live, flat in load, where the default reads 1.004 -> 0.990 and 1.020 -> 0.991.

The busy level (issue 35, session 40; opt-in, `decode_spells="spin"`, `validate_replay --decode-spells
spin`): the grid's points are timed after the profile's pause (60 ms idle, then the 5 ms spin that queues
the step), and a busy engine never pauses. The pause check's sustained_mixed run times its step twice on
the device: after the pause, and with the spin alone (`spin_device_ms_median`: steps ~5 ms apart). Their
ratio, the busy level, is 1.041-1.048 on the H100 33B bf16 profiles, 1.027 with int4-fp8 KV, 1.002 on
the 33B FP8 and 1.000-1.004 on the 6.7B ones. It is the level the live steps with prefill hold over the
paused profile from a run's first seconds at every load, above what the prefill share adds (the form
without decode spells is short of live by +3.9 / +4.3 / +3.7 points at 0.5 / 0.8 / 0.95x on the 33B bf16,
+2.6 / +3.1 / +2.5 with int4-fp8 KV; bench/results/pairs_s40, README section 3). The decode spells'
charge stood in for that level and fell with load where the level does not. With "spin" a step with
prefill launched behind another (not after an idle spell) is charged the busy level times the cap's
factor without decode spells; profiles without the no-pause timing (every H200 grid part) keep the
spells. On the live steps of the H100 33B parts it takes the steps with prefill from 0.99-1.02 x live to
0.996-1.005 (bench/results/pairs_s40/spin_level_whatif.txt).

The limiter's onset (issue 35, session 27; opt-in, `cap_onset="fast"`, `validate_replay --cap-onset
fast`): a sustained run's trace from idle reaches most of its slowdown within two or three steps
(the 33B bf16 on the H200: 29.7, 31.1, 32.5, 33.2 ms against 29.8 paused, then a drift to 33.5 over
2 s), which `fit_sustained_trace`, skipping the first 50 ms, reads as one slow tau (0.27 s). With
"fast", `fit_cap_onset` fits the whole trace as a (1 - e^-t/tau_f) + b (1 - e^-t/tau_s), tau_s the
sustained fit's (33B bf16: tau_f 32 ms, phi = a / (a + b) 0.73), and the factor's excess is
(r - 1) [phi (f_f - fr) / (1 - fr) + (1 - phi) (f - f_ref) / (1 - f_ref)], f_f the weighted busy share
at tau_f (the event loop keeps both) and fr its paused points' value; no decode spell counts. It
reproduces the profile's own pattern runs, which the spells term does not (the mixed step with 1 / 3
decode steps between, back to back: measured 1.034 / 0.997 x paused; fast 1.030 / 1.004, spells
1.079 / 1.081), and it leaves the live 33B mixed steps at one level whatever ran before them
(0.95-0.98 of live by the decode steps since the last prefill, where the spells term spreads them
from 0.98 to 1.05). That level is the 6.7B's too (0.95-0.98), where the pause check's 2.5 s runs
see no cap: live mixed steps run ~1.5-3% over the model, which the spells term's over-charge after
decode spells offsets on the 33B. So the fast form alone loses on the grid (86 intervals inside, 130
means, against the default's 92 / 140; bench/results/fidelity_onset_s27), and stays opt-in until that
excess is modelled. Its cause (session 27's H100 calls): not the block layout, not the live process,
not a step run right after others, but the cap acting over seconds of load (live busy clocks 1.2% /
2.4% under the paused points' on the H100 / H200 6.7B, SW power cap flagged in 41-74% of busy
samples), past the pause check's sustained runs.

The slow sag (issue 35, session 28; on wherever the profile measured it, `cap_sag=False` turns it
off): the terms above come from 2.5 s sustained runs, whose fits settle at tau ~0.3 s. Session 27's
H100 calls found the live mixed steps' remaining ~1.5-3% excess growing over seconds of load (a 7 s
replay pass of live steps: 1.010 -> 1.017 -> 1.033 x paused), the busy SM clock 1.2% (H100) / 2.2-2.4%
(H200) under the paused points' with the SW power cap flagged: the limiter sagging further, past the
runs' horizon. Profiles since session 28 run the pause check's "stream_mixed" run for 6 s after 2 s
idle (12 s after 3 s as first built), the grid's mixed shapes in turn, two in flight, in 1 s bins (each bin's device time over its
shapes' paused). `fit_stream_sag` fits the bins from the second on as A + B (1 - e^-t/tau_sag) and
reads the sag past the horizon: sag = R_end / R(2.5 s) - 1. The event loop and the live-step scorer
keep a third weighted prefill share f_sag at tau_sag (spans weighed by their kind's power, as f), and
a step's factor gains sag (f_sag - f_ref_sag) / (w_stream - f_ref_sag), w_stream the stream shapes'
mean weight (the share at which it sagged), f_ref_sag the paused points' share at tau_sag; scaled by
the step's compute share against the stream's where the cap goes by compute. Profiles without the
binned run are charged exactly as before. On the H100 6.7B the stream was flat (1.001-1.004 by second
for 12 s, sag 0.0; bench/results/fidelity_sag_s28): the limiter reaches each step kind's level within
the first second, which "Anchors in device time" below measures; the term waits for the H200's streams.

Anchors in device time (issue 35, session 28; opt-in, `cap_anchors="stream"`, `validate_replay
--cap-anchors stream`): the ratios above (r of the pause check's step, r_mix, r_packed) come from the
sustained runs' wall times, each step launched when the one before has finished, against paused runs
that pay an idle host's launch as well (the H200 6.7B's mixed step read 0.955 back to back against
paused in wall time). On the H100 each kind run back to back two in flight, in device time, ran under
the SW power cap in every NVML sample, throttled by its own power within the first second (mixed
1.008-1.017 x paused at 1,920 MHz, the 2,048-token packed step 1.13 at 1,560; bench/results/
fidelity_sag_s28), which is about the live mixed steps' excess there. Profiles since session 28 carry
those runs ("stream_kind": prefill, mixed, mixed_two_chunks, decode, packed); with "stream" the cap
takes r, r_mix and r_packed from them (the time constants and f_ref stay the sustained traces'), and
every weight follows as before. Scored only as a what-if so far (bench/results/fidelity_sag_s28,
anchors_whatif.py: the runs measured on an H100 grafted onto the s21 H100 6.7B mixed part's profile): the
reference step's ratio goes from 0.92 (wall) to 1.083 (device), and the busy steps with <= 512 prefill
tokens from 0.989 to 1.014 of live: over-corrected, the token-rate weights between a non-throttling
mixed anchor and the reference too steep for the live 256-token chunks. Opt-in until the weights are.
Runs that carry their shape (since session 28's last change) add the light-decode mixed step and the
two-chunk step as anchors of their own at their token rates (EXTRA_ANCHOR_KINDS): the weight line
then bends where the kinds say the limiter starts to act.

Budget-filling packed steps (issue 35, session 18): under load the engine fills its token budget
with several prompts beside the decodes (live on the H200, 6.7B / 33B FP8: d + p = 2,048, d 27-90,
4-5 prompts, 3-5% of the busy time), where the grid's points past 1,024 tokens all had d 0: the model
extrapolated there (the 6.7B FP8 charged them 0.935 of live). Profiles since then measure one point
there (`bench.engine.profile.step_shapes`, `--budget-packed-points`: on the validate's grid 64
decodes beside 4 x 496 tokens, where the live ones are; they lie just outside the residual hull
either way, by their decodes' context and cached-prefix chunks, and take the nearest point's
residual). Such points (decodes beside more prefill tokens, in k > 1 prompts, than any
single-chunk point with decodes) are left out of the regression and kept for the residual
interpolation, as the decode buckets' first batches are: one point at the budget's edge with its
own excess would otherwise move the fit's coefficients and with them every step the residuals do
not pin. A stand-in point (at the model's time x the live packed steps' live / model) moved the
6.7B FP8's live packed steps from 0.935 to 0.989 of live and left its other steps with prefill at
0.9937 (the 33B FP8's: 1.011 -> 1.008, the others 0.9974 -> 0.9973; bench/results/fidelity_hull_s18).
A profile without such points fits as before.

Past the measured decode batches (issue 35, session 17): a decode-only step of more sequences
than the profile's largest decode batch d_max (64 in the validate's grids up to session 16; the
live 6.7B runs reached 125-132 at 0.95-1.2x, the 33B's 98-100) is charged, by default, the
regression plus the nearest point's residual: the regression's slope in d, pulled by the mixed
points (0.10 ms a sequence on the 6.7B FP8 against 0.065 between its decode points of 49 and 64
and 0.067 live past 64), charged the 6.7B's d 97-128 10-16% over live. `decode_extrapolation=
"slope"` (opt-in) follows the last measured bucket's line in d instead (the model at d_max plus the
slope from d_lo, the bucket's smallest measured batch, times d - d_max, at the step's context per
sequence): the 6.7B's d > 64 within ~3%, 1.2x TPOT P50 +0.4 -> -1.4% (FP8), +2.1 -> +0.8% (bf16),
but the 33B bf16 (s13, decode points 32 and 64 only) 7-16% under past 64, where its next decode
graph (96 rows) costs 1.3 ms more at once: what the step costs past the last measured bucket edge
depends on the model and format (6.7B FP8 +0.0 ms at 64 -> 65, bf16 +0.3, 33B bf16 +1.3), which no
rule on the measured points can know. The validate's grid therefore measures past it (decode
batches to 128, `bench.simulator.validate.profile_grid`).

Unequal contexts (issue 35, session 19): the profile's decode points give every sequence one
context, and a decode-only step was charged at its total context, i.e. as if each sequence had the
mean; live with mixed prompt and output lengths (the H100 6.7B part, session 18) those steps ran
over the model from 2% at max / mean context 1 to 12% at 3+, 81% of the part's error. The decode
kernel's programs are per (sequence, kv head, split): a long sequence's run on after the short
ones end. `sims.decode_spread` models the launch (processor sharing of the bandwidth, a lone
program capped at kappa times its share of a full wave, the kernel's own plan per decode bucket
from the profile's `decode_attention`); the profile's "spread" points (d - 1 sequences at c and
the last at 4c, `decode_context_lens`) are kept out of the fit and the residuals, each read as the
multiple of its total context at which the fitted model gives its time, and that multiple solved
for kappa (`decode_spread.solve_kappa`), interpolated in log d between the points. With them
(`decode_spread="measured"`, the default) the event loop charges a decode-only step at its total
context times the launch's multiple (`decode_context_multiple`); steps with prefill have a term of
their own (below: their launch is tiled and split otherwise). A profile without spread
points is charged exactly as before; `decode_spread=KAPPA` is a what-if on any CUDA profile (the
plan from the kernel's constants of the time, `sims.decode_spread.LEGACY_*`).

Unequal contexts beside a chunk (issue 35, session 21): a step with prefill runs its decodes'
attention too, and their unequal contexts cost it more than their mean: the profile's "mixed
spread" points (each spread point's decodes beside one 256-token chunk, since session 20) ran 1.035
-1.075 x the model at their decodes' mean context on the H100's 6.7B (the equal-context mixed points
are the fit's), and the live steps with a 129-256-token chunk ran, without the power-by-kind cap,
0.96-0.98 of the model at max / mean context >= 3 against ~1.00 below 2 (bench/results/
fidelity_grid_h100_s21). Each mixed spread point is read as the multiple of its decodes' total
context at which the fitted model gives its mixed step's time, and that multiple solved for a kappa
of its own on the decode launch plan without splits (`solve_kappa`): a mixed step runs the same
paged kernel tiled for queries (`max_query_len` 2) and split by the mixed rule, at least
PROGRAMS_PER_SM programs a SM, which the chunk's query blocks already give at the grid's shapes (one
split), so a long decode's programs run its whole context; the kappa absorbs the rest of the
launch's difference. Interpolated in log d. With them (`mixed_spread="measured"`, the
default) a step with prefill is charged its decodes' total context times that launch's multiple
(`mixed_context_multiple`); a profile without mixed spread points, or `mixed_spread="off"`, as
before; `mixed_spread=KAPPA` is a what-if wherever the decode term has its plan.

Whole tiles beside a chunk (issue 35, session 33; `mixed_tiles="on"`, opt-in): in a step with
prefill the paged kernel runs every sequence as a program of `PREFILL_ROWS` query rows
(backend.kernels.paged_attention), a decode's one row among them, over `BLOCK_N`-token tiles of its
context; the tile's dots cost the same whether its keys are all valid or one is, so a decode is
charged for its whole tiles, ceil(c / 64) x 64 tokens. The profile's mixed points put every decode
at a multiple of 64 (512 / 576 / 640), where tiles and tokens agree; live contexts fall anywhere
and average ~half a tile more. On an H100's 6.7B FP8 part with the conditioned profile
(bench/results/conditioned_s33) the busy one-chunk mixed steps read raw model / live 0.983-0.986
at d 8-23 falling to 0.973-0.975 at d 32-47; charged by whole tiles 0.991-0.993 at every d from 8
to 47 (0.9995 at 48-63): the slope in d was the tiles, a flat ~0.8 % is something else. Decode-only
steps (one query row padded to 16, memory-bound) read the model within 0.5 % without it.
Measured on an H100 (session 34, bench/results/tiles_s34): contexts spread over 512-640 but each on
a tile edge cost what equal ones do; every decode one token past an edge costs a mixed step 0.6-1.0
of a whole tile and a decode-only step about a third. So the term is, in general, c + phi x (the
tokens to the tile's end), phi 1 for "on"; with `mixed_tiles="measured"` (the default since session
35) phi is read from the profile's tile-edge pairs (`--tile-edge-pairs`: every decode on an edge, at
the edge + 1 and at the next edge, timed in turn, beside the mixed spread points' chunk and alone;
`set_tile_pairs`) on a CUDA profile; a profile without them (every profile before 2026-12-07 09:30
UTC) is charged as before. Session 34's off-edge points (the edge + 1 only, read against the fit:
`set_tile_edges`) are recorded, not charged: a partial tile's 0.5-2.5 % is the size of the fit's
residual, and the H100 6.7B mixed-lengths profile's points gave -0.4 to 8 of a tile each
(bench/results/tiles_s35). On two H100 profiles the pairs read beside a chunk 1.10 and 1.01 of a whole
tile, alone 0.22 and 0.22 (the whole tile at the fit's linear context cost: their pairs had no next
twin yet); charged at those, the H100 6.7B FP8 cell read 15 of 15 intervals inside (14 without) and
the mixed-lengths cell's TPOT P50 moved by 0.1 point. `decode_tiles` charges decode-only steps alike
at the decode launch's tile (`decode_context_multiple`): "measured" (the default, the pairs'
decode-only fraction), "off", or a what-if fraction.

The prefix term from twins (issue 35, session 26): the grid's profiles measure cached-prefix chunks
at one start, 256, each beside a twin at start 0 (same decodes and chunk, 256 fewer context tokens);
live, chunks start anywhere up to the longest prompt (the mixed lengths: past 2,000). Fitted as one
coefficient of the regression with Σp_i·s_i also a residual axis, the charge at a start past 256
came from the residual surface outside its hull (the nearest point's residual): on session 25's
H200 6.7B mixed profile a 256-token chunk beside 16 decodes was charged 12.20 ms at start 512 and
11.68 at 1,024, less than at start 0 (11.69), and live the chunks after a prefix >= 1,024 ran
1 / 0.923 of the model (33B: 1 / 0.930) where those from start 0 ran 1 / 0.969 (1 / 1.030). Now
h is set from the twins alone (`_twin_prefix_slope`: their differences less the context term's
share, a line through the origin in Σp_i·s_i), the regression fits the times less h·Σp_i·s_i, and
the residuals live in (d, p, ctx[, Σp_i²]) over the start-0 points: the charge rises by h·p·s with
the start, as the prefix attention's work does. `prefix_term="fit"` is the model before, and
what a profile gets whose prefix points are not all twins at one start (the speculative-decoding
profiles measure starts 1,024 and 3,072: a residual axis they support).

`step_time(d, p, ctx, prefill_chunks=None)`: without `prefill_chunks` a step's p tokens are one
chunk from position 0 (today's `CostModel` interface); with them — the step's prefill chunks, each an
int (tokens from position 0), an (num_tokens, start_pos) pair, or an object with `token_ids` and
`start_pos` (the scheduler's chunks) — the model charges each chunk by its own length and prefix.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
from scipy.optimize import nnls
from scipy.spatial import QhullError

from sims.cost import decode_times_by_steps
from sims.decode_spread import DecodeLaunchPlan, expand_context_lens, solve_kappa, spread_factor

_TIME_KEYS = (("step_time_s", 1.0), ("step_s", 1.0), ("seconds", 1.0), ("step_ms", 1e-3),
              ("mean_ms", 1e-3), ("ms", 1e-3), ("time_ms", 1e-3))
_D_KEYS = ("num_decode_seqs", "decode_batch_size", "num_decode", "batch_size")
_P_KEYS = ("num_prefill_tokens", "prefill_tokens")
_C_KEYS = ("num_context_tokens", "context_tokens")
_K_KEYS = ("num_prefill_seqs",)
_S_KEYS = ("prefill_context_len",)
# the engine's default mixed-step graph buckets up to deaece6 (backend.runner.cuda_graphs), which CUDA
# profiles written before the profile named its buckets were measured with (the H200 profiles of
# issue 18 among them); later profiles name theirs
LEGACY_CUDA_TOKEN_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024,
                              1280, 1536, 1792, 2048)
# the window of the power-cap model (module doc): the H200's clock followed the prefill share of
# about the last 100 ms (a prefill step ran 1.005 / 1.04 / 1.05-1.09 x at shares 0 / 0.5 / 1)
POWER_CAP_WINDOW_S = 0.1
# the context tokens of one attention tile in a step with prefill (backend.kernels.paged_attention's
# BLOCK_N, which its launch takes whatever the pages' codec; a test holds the two equal): module doc,
# "Whole tiles beside a chunk"
MIXED_BLOCK_N = 64


def charges_tile_pairs(profile_doc: dict) -> bool:
    """The profile's tile-edge pairs set the tiles terms' fractions ("measured", the default): it has
    them and was measured on CUDA (the CPU's attention runs no tiles; its pairs are recorded only)."""
    return bool(profile_doc.get("tile_edge_pairs")) and str(profile_doc.get("device", "")).startswith("cuda")


def tile_pad(contexts, block_n: int) -> int:
    """The tokens from each decode's context to the end of its last `block_n`-token tile, summed: what
    a partial tile leaves unread (module doc, "Whole tiles beside a chunk")."""
    return sum(-(-int(c) // block_n) * block_n - int(c) for c in contexts)
_FEATURE_NAMES = ("a_s", "b_s_per_seq", "c_s_per_prefill_tok", "e_s_per_ctx_tok", "f_s_per_prefill_tok2",
                  "g_s_per_prefill_seq", "h_s_per_prefill_tok_prefix_tok", "i_s_per_mixed_step",
                  "j_s_per_tok_past_knee", "l_s_per_draft_token")


def _pick(point: dict, keys: tuple, default=None):
    for key in keys:
        if key in point:
            return point[key]
    if default is None:
        raise ValueError(f"profile point {point} has none of {keys}")
    return default


def _features(d, p, c, k=None, q=None, x=None, cols: tuple = (False, False),
              pad=None, v=None) -> np.ndarray:
    """[1, d, p + pad (the graph's pad tokens), ctx, q = Σp_i² (p² by default)] + [k] +
    [x = Σp_i·s_i] + [1 if the step holds prefill tokens] + [tokens past the compute knee] +
    [v = draft tokens verified] as `cols` asks."""
    d, p, c = (np.asarray(v, dtype=np.float64) for v in (d, p, c))
    q = p * p if q is None else np.asarray(q, dtype=np.float64)
    gemm_p = p if pad is None else p + np.asarray(pad, dtype=np.float64)
    f = [np.ones_like(d), d, gemm_p, c, q]
    if cols[0]:
        f.append((p > 0).astype(np.float64) if k is None else np.asarray(k, dtype=np.float64))
    if cols[1]:
        f.append(np.zeros_like(d) if x is None else np.asarray(x, dtype=np.float64))
    if len(cols) > 2 and cols[2]:
        f.append((p > 0).astype(np.float64))
    if len(cols) > 3 and cols[3] is not None:  # the GEMMs' compute knee: tokens past it
        f.append(np.maximum(0.0, d + gemm_p - cols[3]) * (p > 0))
    if len(cols) > 4 and cols[4]:  # verifies: every draft's row sampled and read back
        f.append(np.zeros_like(d) if v is None else np.asarray(v, dtype=np.float64))
    return np.stack(f, axis=-1)


def _residual_interpolator(space: np.ndarray, resid: np.ndarray):
    """q -> the fit's residual at q, from the measured points `space` (n, dims) and their
    residuals: piecewise linear inside the points' convex hull (exact at each point), the nearest
    point's residual outside it (coordinates scaled by their span); None (the regression alone)
    when the points are too few or degenerate (all in one plane). Outside the hull a residual
    of 0 had left the bare regression: on the H200's verify profile a decode step of 8 sequences
    at 3,110 tokens each sat just past the (8, 3,072) point and was charged 18.96 ms where that
    point measured 20.81 (issue 28)."""
    if not len(space):
        return None
    span = space.max(axis=0) - space.min(axis=0)
    dims = np.flatnonzero(span > 0)
    if not len(dims):
        const = float(resid.mean())
        return lambda q: const
    xs = space[:, dims] / span[dims]
    if len(dims) == 1:
        order = np.argsort(xs[:, 0])
        xo, ro = xs[order, 0], resid[order]
        # np.interp holds the end values outside the range: the nearest point's residual
        return lambda q: float(np.interp(float(np.asarray(q, dtype=np.float64)[dims[0]])
                                         / span[dims[0]], xo, ro))
    from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator
    if len(space) <= len(dims) + 1:
        return None
    try:
        lin = LinearNDInterpolator(xs, resid, fill_value=np.nan)
    except (QhullError, ValueError) as exc:  # degenerate (coplanar) points: regression only
        warnings.warn(f"profile: residual interpolation disabled ({exc.__class__.__name__})")
        return None
    near = NearestNDInterpolator(xs, resid)

    def at(q):
        z = np.asarray(q, dtype=np.float64)[dims] / span[dims]
        v = float(lin(z).ravel()[0])
        return v if np.isfinite(v) else float(near(z).ravel()[0])
    return at


def _twin_prefix_slope(d, p, c, k, q, s, v, pad, times_s, cols, fit) -> dict | None:
    """The cached-prefix term h (s per Σp_i·s_i) from the prefix points and their start-0 twins
    (module doc, "The prefix term from twins"): each point with s > 0 paired with the point of the
    same decodes and chunks at s = 0 whose context is k·s smaller; their difference, less the
    context term's share of those k·s tokens (from a regression over the start-0 points the
    regression fits, `fit`), fitted as h·Σp_i·s_i through the origin (the large prefixes weigh
    most: the term is for extrapolating to longer ones). {"h_s", "pairs"}, or None unless every
    prefix point is a prefill chunk with a twin, all at one start: a profile that measured several
    starts (the speculative-decoding profiles: 1,024 and 3,072) gives the residual surface an axis
    it can follow, and verify points (v > 0) are chunks at a position with no twin; such profiles
    are fitted as before."""
    base = s <= 0
    if len(np.unique(s[(s > 0) & (p > 0)])) > 1:
        return None
    pairs = []
    for i in np.flatnonzero((s > 0) & (p > 0)):
        twin = np.flatnonzero(base & (d == d[i]) & (p == p[i]) & (k == k[i]) & (v == 0)
                              & (c == c[i] - k[i] * s[i]))
        if v[i] > 0 or not len(twin):
            return None
        pairs.append((i, int(twin[0])))
    if not pairs:
        return None
    base &= fit
    f = _features(d, p, c, k, q, None, cols[:1] + (False,) + cols[2:3], pad, v)[base]
    fs = np.maximum(np.abs(f).max(axis=0), 1e-12)
    e = float((nnls(f / fs, times_s[base])[0] / fs)[3])
    x = np.array([p[i] * s[i] for i, _ in pairs])
    y = np.array([times_s[i] - times_s[j] - e * k[i] * s[i] for i, j in pairs])
    h = max(0.0, float(x @ y / (x @ x)))
    return {"h_s": h, "pairs": len(pairs)}


def _chunk_shape(chunks) -> tuple[int, int, int, int, int]:
    """(Σ tokens, k, Σ tokens², Σ tokens·start, Σ start) of prefill chunks (ints, pairs or chunk
    objects)."""
    p = k = q = x = z = 0
    for ch in chunks:
        if isinstance(ch, (int, np.integer)):
            n, s = int(ch), 0
        elif isinstance(ch, (tuple, list)):
            n, s = int(ch[0]), int(ch[1])
        else:
            n, s = len(ch.token_ids), int(ch.start_pos)
        if n:
            p, k, q, x, z = p + n, k + 1, q + n * n, x + n * s, z + s
    return p, k, q, x, z


def _pad_tokens(d, p, buckets: np.ndarray | None):
    """Pad tokens of steps of d decodes and p prefill tokens run as the graph of the smallest
    token bucket >= d + p: 0 for decode-only steps (their graphs pad sequence rows: decode
    buckets, not modelled), for steps over the largest bucket (eager) and without buckets."""
    d, p = np.asarray(d, dtype=np.float64), np.asarray(p, dtype=np.float64)
    if buckets is None or not len(buckets):
        return np.zeros_like(p)
    t = d + p
    i = np.searchsorted(buckets, t)  # first bucket >= t
    b = buckets[np.minimum(i, len(buckets) - 1)]
    return np.where((p > 0) & (i < len(buckets)), b - t, 0.0)


def fit_sustained_trace(t_s, step_ms, skip_first: int = 1, skip_s: float = 0.05) -> dict | None:
    """Fit a sustained run's step times from an idle start: T(t) = A + B (1 - exp(-t / tau)), t the
    step's start (s) since the first step. Least squares for A, B at each tau of a log grid (5 ms
    to 4x the trace's span), the best tau kept. The first `skip_first` steps and those starting in
    the first `skip_s` are left out (the step after an idle spell also pays its launch, and the
    clock may still be rising from idle: the limiter's fall takes ~0.2-0.5 s, the rise ms). Returns
    {tau_s, start_ms (A, at the first kept step), end_ms (the fit at the last step), steady_ms
    (A + B where the trace settled, tau <= a third of its span, else end_ms: no extrapolation),
    settled, rmse_ms, n} or None (fewer than 6 steps kept)."""
    t = np.asarray(t_s, dtype=np.float64)
    y = np.asarray(step_ms, dtype=np.float64)
    if len(t) != len(y) or not len(t):
        return None
    keep = (np.arange(len(t)) >= skip_first) & (t >= t[0] + skip_s)
    t, y = t[keep], y[keep]
    if len(t) < 6:
        return None
    t = t - t[0]
    span = float(t[-1])
    if span <= 0:
        return None
    best = None
    for tau in np.geomspace(0.005, 4.0 * span, 240):
        x = -np.expm1(-t / tau)
        X = np.stack([np.ones_like(x), x], axis=-1)
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        sse = float(((X @ coef - y) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, float(tau), float(coef[0]), float(coef[1]))
    sse, tau, a, b = best
    end = a - b * np.expm1(-span / tau)
    settled = tau <= span / 3.0
    return {"tau_s": tau, "start_ms": a, "end_ms": float(end), "steady_ms": a + b if settled else float(end),
            "settled": bool(settled), "rmse_ms": float(np.sqrt(sse / len(y))), "n": len(y)}



def fit_cap_onset(t_s, step_ms, paused_ms: float, tau_slow_s: float) -> dict | None:
    """Split a sustained run's slowdown into the limiter's fast onset and its slow drift (module
    doc, "The limiter's onset"): T(t) / paused - 1 = a (1 - e^-t/tau_f) + b (1 - e^-t/tau_s), t each
    step's start since the first (every step kept: the first, at t = 0, ran at the paused speed),
    tau_s the sustained fit's (`fit_sustained_trace`), a, b >= 0 by least squares at each tau_f of a
    log grid (2-300 ms), the best kept. Returns {tau_fast_s, phi (a / (a + b): the fast part's share
    of the slowdown), fast, slow, rmse_ms, n} or None (fewer than 4 steps, or nothing to split)."""
    t = np.asarray(t_s, dtype=np.float64)
    y = np.asarray(step_ms, dtype=np.float64) / float(paused_ms) - 1.0
    if len(t) != len(y) or len(t) < 4 or not tau_slow_s or tau_slow_s <= 0 or paused_ms <= 0:
        return None
    t = t - t[0]
    xs = -np.expm1(-t / tau_slow_s)
    best = None
    for tau in np.geomspace(0.002, 0.3, 160):
        xf = -np.expm1(-t / tau)
        coef = nnls(np.stack([xf, xs], axis=-1), y)[0]
        sse = float(((np.stack([xf, xs], axis=-1) @ coef - y) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, float(tau), float(coef[0]), float(coef[1]))
    sse, tau, a, b = best
    if a + b <= 0:
        return None
    return {"tau_fast_s": tau, "phi": a / (a + b), "fast": a, "slow": b,
            "rmse_ms": float(np.sqrt(sse / len(y)) * paused_ms), "n": len(y)}


def fit_cap_delay(meta: dict) -> dict | None:
    """The delayed onset's terms from a profile's pause check (module doc, "The delayed onset"): {"delay_s" (the
    start, since the trace's first, of the first step of the "sustained" trace past halfway from its first two
    steps' level to its settled half's, each in device time over the "stream_kind" prefill run's paused device
    time), "r_stream" (the "stream_kind" mixed run's ratio), "shape" (that run's step), "trace_early",
    "trace_settled"}; None where the profile lacks a run or its trace does not rise."""
    runs = (meta.get("pause_check") or {}).get("runs", [])
    trace = next((r for r in runs if r.get("run") == "sustained" and r.get("trace_device_ms")
                  and r.get("trace_t_ms")), None)
    kinds = {r.get("kind"): r for r in runs if r.get("run") == "stream_kind" and r.get("ratio")}
    base = (kinds.get("prefill") or {}).get("paused_device_ms_median")
    mixed = kinds.get("mixed")
    if trace is None or not base or mixed is None or len(mixed.get("shape") or ()) < 3:
        return None
    ratio = [float(x) / float(base) for x in trace["trace_device_ms"]]
    t_ms = [float(x) for x in trace["trace_t_ms"]]
    if len(ratio) < 4 or len(ratio) != len(t_ms):
        return None
    early, settled = float(np.median(ratio[:2])), float(np.median(ratio[len(ratio) // 2:]))
    if settled <= early:
        return None
    mid = 0.5 * (early + settled)
    at = next(t for t, x in zip(t_ms, ratio) if x >= mid)
    return {"delay_s": (at - t_ms[0]) / 1e3, "r_stream": float(mixed["ratio"]),
            "shape": [int(x) for x in mixed["shape"]], "trace_early": early, "trace_settled": settled}


# the sustained runs' span (bench.engine.profile.SUSTAIN_S): the horizon of the terms fitted on them,
# past which the stream's sag is what they do not charge (`fit_stream_sag`)
SUSTAIN_HORIZON_S = 2.5


def fit_stream_sag(bins: list[dict], bin_s: float, t_ref_s: float = SUSTAIN_HORIZON_S,
                   skip_s: float = 1.0) -> dict | None:
    """The limiter's slow sag from the pause check's long "stream_mixed" run (module doc, "The slow
    sag"): its bins' ratios (device time over paused) at each bin's middle t, those from `skip_s`
    on (the first second holds the onset the sustained runs' terms charge), fitted as
    R(t) = A + B (1 - e^-t/tau), B >= 0, least squares at each tau of a log grid (0.2 s to 4x the
    span), the best kept. The sag is the rise past the terms' horizon `t_ref_s`:
    R_end / R(t_ref) - 1, R_end = A + B where the stream settled (tau <= a third of its span), else
    the fit at its last bin (no extrapolation). Returns {tau_s, sag, ref_ratio, end_ratio, settled,
    rmse, n} or None (fewer than 4 bins kept)."""
    t = np.array([float(b["t_s"]) + bin_s / 2 for b in bins], dtype=np.float64)
    y = np.array([float(b["ratio"]) for b in bins], dtype=np.float64)
    keep = t >= skip_s
    t, y = t[keep], y[keep]
    if len(t) < 4:
        return None
    span = float(t[-1])
    best = None
    for tau in np.geomspace(0.2, 4.0 * span, 200):
        x = -np.expm1(-t / tau)
        X = np.stack([np.ones_like(x), x], axis=-1)
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        if coef[1] < 0:  # no rise: the level alone
            coef = np.array([float(y.mean()), 0.0])
        sse = float(((X @ coef - y) ** 2).sum())
        if best is None or sse < best[0] - 1e-15:
            best = (sse, float(tau), float(coef[0]), float(coef[1]))
    sse, tau, a, b = best
    settled = tau <= span / 3.0
    end = a + b if settled else a - b * float(np.expm1(-span / tau))
    ref = a - b * float(np.expm1(-t_ref_s / tau))
    return {"tau_s": tau, "sag": max(0.0, end / ref - 1.0) if ref > 0 else 0.0, "ref_ratio": ref,
            "end_ratio": end, "settled": bool(settled), "rmse": float(np.sqrt(sse / len(y))), "n": len(y)}

# a compute knee's support (`ProfileCost`): the regression's points past it hold at least this many
# step sizes (tokens, padded to their graph bucket), and the largest reaches at least halfway from the
# knee to the largest step the profile measured: the slope past the knee is fitted across them and
# carries the model to the top; 0: any knee (the model before session 27)
KNEE_SUPPORT = 2

# the engine's launch deadline's slack (backend.engine.continuous.LAUNCH_SLACK_S), here so that this
# module needs no engine import
PLAN_LEAD_SLACK_S = 0.001


def _sustained_ratio(run: dict) -> tuple[float, dict | None]:
    """(sustained / paused, the trace's fit) of a pause check run paused then traced back to back
    ("sustained_mixed", "sustained_packed"): the level its trace settles at (`fit_sustained_trace`'s
    steady_ms), or its back-to-back median without a trace, over its paused median."""
    fit = None
    if run.get("trace_ms"):
        fit = fit_sustained_trace(np.asarray(run["trace_t_ms"]) / 1e3, run["trace_ms"])
    steady = fit["steady_ms"] if fit is not None else float(run["step_ms_median"])
    return steady / float(run["paused_ms_median"]), fit


# with `cap_anchors="stream"`: the "stream_kind" runs placed among the weights' anchors at their own
# token rates, beside the mixed and packed ones (module doc, "Anchors in device time")
EXTRA_ANCHOR_KINDS = ("mixed_short", "mixed_two_chunks")


def _anchored(run: dict | None, ratio: float | None) -> dict | None:
    """A "sustained_mixed" / "sustained_packed" run with its back-to-back level taken from its kind's
    "stream_kind" ratio (device time, `cap_anchors="stream"`): its trace dropped, so that
    `_sustained_ratio` reads paused x ratio / paused; the run itself where the kind was not streamed."""
    if run is None or ratio is None:
        return run
    out = {k: v for k, v in run.items() if k not in ("trace_ms", "trace_t_ms", "trace_device_ms")}
    out["step_ms_median"] = float(run["paused_ms_median"]) * ratio
    out["whatif"] = "stream_kind"
    return out


def plan_leads(profile_doc: dict) -> dict | None:
    """The async loop's plan lead by the kind of the step in flight, from a profile's launch times:
    the engine plans the next step 2 x its host launch time + 1 ms before the step in flight ends
    (`backend.engine.continuous.launch_deadline`), so {"decode_only_s": 2 x the median
    `launch_ms_median` of the decode-only points + 1 ms, "with_prefill_s": the same over the points
    with prefill tokens}; None without launch times. The engine's own launch estimate is an average
    over the recent steps of both kinds and its device-time estimate lags a varying step, so this is
    the formula on the profile's per-kind launches, not a measurement of the serving loop: on the
    H200 6.7B (s14) 1.75 / 3.91 ms against the live loop's 2.22 / 3.65 (bench.simulator.gateway_loop),
    where the profile's one lead (decode points alone) had been 1.75 for both kinds."""
    pts = profile_doc.get("points") or []
    out = {}
    for key, sel in (("decode_only_s", lambda x: not x.get("num_prefill_tokens")),
                     ("with_prefill_s", lambda x: bool(x.get("num_prefill_tokens")))):
        launch = [x["launch_ms_median"] for x in pts if sel(x) and "launch_ms_median" in x]
        if not launch:
            return None
        out[key] = 2 * float(np.median(launch)) / 1e3 + PLAN_LEAD_SLACK_S
    return out


def ewma_duty_ref(step_s: float, pause_s: float, tau_s: float) -> float:
    """The exponential average (time constant tau) of a busy indicator at a step's start when
    steps of `step_s` alternate with idle pauses of `pause_s` for long (the profile's paused
    points): (1 - e^-s/tau) e^-P/tau / (1 - e^-(s+P)/tau)."""
    s, p = max(0.0, step_s) / tau_s, max(0.0, pause_s) / tau_s
    den = -np.expm1(-(s + p))
    return float(-np.expm1(-s) * np.exp(-p) / den) if den > 0 else 0.0


def _first_batches(buckets) -> set[int]:
    """The batches past each decode bucket's edge that are not buckets: previous + 1 and + 2."""
    b = sorted({int(x) for x in buckets or () if int(x) > 0})
    return {x for lo, hi in pairwise(b) for x in (lo + 1, lo + 2) if x < hi}


def _decode_tail(d: np.ndarray, buckets) -> tuple[int, int] | None:
    """(d_lo, d_max): the largest measured decode batch d_max and the smallest measured one in
    its decode bucket's batches [previous bucket + 1, bucket] (the line decode steps past d_max
    follow: the module doc), the measured batch below d_max where that bucket has no other, or
    the buckets are unknown; None with fewer than two measured decode batches."""
    ds = sorted({int(x) for x in d if x > 0})
    if len(ds) < 2:
        return None
    hi = ds[-1]
    b = sorted({int(x) for x in buckets or () if int(x) > 0})
    i = int(np.searchsorted(b, hi)) if b else 0
    first = (b[i - 1] + 1) if b and 0 < i < len(b) and b[i] == hi else None
    inside = [x for x in ds[:-1] if first is not None and x >= first]
    return (inside[0] if inside else ds[-2]), hi


def _bucket_segments(buckets, d: np.ndarray, space: np.ndarray, resid: np.ndarray):
    """(bucket edges, {bucket: residual interpolator over the decode points of its own batches
    [previous bucket + 1, bucket]}) where the decode points include one at a bucket's first
    batches (`_first_batches`); else None (interpolate across buckets, as before)."""
    if not buckets or not len(d):
        return None
    b = sorted({int(x) for x in buckets if int(x) > 0})
    if not _first_batches(b) & {int(x) for x in np.unique(d)}:
        return None
    segs, lo = {}, 1
    for hi in b:
        m = (d >= lo) & (d <= hi)
        if m.any():
            f = _residual_interpolator(space[m], resid[m])
            if f is not None:
                segs[hi] = f
        lo = hi + 1
    return np.array(b, dtype=np.float64), segs


def _legacy_launch_plan(meta: dict) -> DecodeLaunchPlan | None:
    """The decode launch plan of a CUDA profile written before profiles named it
    (`DecodeLaunchPlan.legacy`: the model's kv heads, the graphs' buckets split for max_model_len);
    None on the CPU or for a model whose shape is unknown."""
    buckets = meta.get("cuda_graph_decode_buckets")
    if not buckets or not str(meta.get("device", "")).startswith("cuda"):
        return None
    try:
        from sims.model_shape import load_model_shape
        heads = load_model_shape(str(meta.get("model", ""))).num_kv_heads
    except (KeyError, ValueError, FileNotFoundError, OSError):
        return None
    return DecodeLaunchPlan.legacy(heads, buckets, int(meta.get("max_model_len") or 16384))


class ProfileCost:
    accepts_prefill_chunks = True  # step_time(..., prefill_chunks=...) charges each chunk by itself

    def __init__(self, points: np.ndarray, times_s: np.ndarray, *, num_blocks: int | None = None,
                 block_size: int | None = None, meta: dict | None = None, ctx_quantum: int = 64,
                 token_buckets=None, launch_times_s=None, hide_launch: bool = False,
                 device_times_s=None,
                 power_cap: bool = False, cap_by_compute: bool = True, decode_buckets=None,
                 cap_by_power: bool = False, decode_extrapolation: str = "nearest",
                 spread_points: list[dict] | None = None, decode_spread: str | float = "measured",
                 mixed_spread: str | float = "measured", decode_spells: bool | str = True,
                 prefix_term: str = "twins", cap_onset: str = "slow", knee_support: int = KNEE_SUPPORT,
                 cap_sag: bool = True, cap_anchors: str = "sustained", mixed_tiles: str = "measured",
                 decode_tiles: str | float = "measured"):
        """points: (n, 3) of (num_decode_seqs, num_prefill_tokens, num_context_tokens), or (n, 4) /
        (n, 5) with num_prefill_seqs k (the p tokens are k chunks of p/k each; default 1 when p > 0)
        and prefill_context_len s (each chunk starts at position s; default 0) appended, or (n, 6)
        with num_draft_tokens v too (the k chunks were verifies of p/k - 1 drafts; default 0).
        `token_buckets`: the engine's mixed-step CUDA-graph token buckets (a step with prefill
        tokens is charged for the bucket it runs as; None or empty: for its own tokens).
        `launch_times_s`: the host's launch part of each point's time; with `hide_launch` the
        model charges steps without it (see the module doc). `device_times_s`: each point's
        device time queued behind device work (the module doc, "Device time"); with
        `hide_launch` (and `launch_times_s`) the fit is of these instead of step minus launch.
        `cap_by_compute` (with
        `power_cap`): a step's slowdown scaled by its compute share against the pause check's
        step (`compute_share`, the module doc); False: every step with prefill slowed alike.
        `decode_buckets`: the decode graphs' batch buckets (default: the profile's
        `cuda_graph_decode_buckets`); decode-only steps are interpolated inside their bucket where
        the profile measured a bucket's first batch (the module doc). `cap_by_power` (opt-in, with
        `power_cap`, where the pause check has a "sustained_mixed" run): each step with prefill
        weighs in the busy share by the power its kind draws (`cap_weight`, the module doc);
        False (the default), or a profile without that run: every such step weighs 1.
        The pause check's "sustained_packed" run (the grid's largest prefill-only step) adds a
        third anchor to those weights (module doc, "Power by step kind").
        `decode_extrapolation`: "nearest" (the default) charges decode-only steps past the largest
        measured decode batch the regression plus the nearest point's residual; "slope" (opt-in)
        along the last measured bucket's line in d (module doc, "Past the measured decode
        batches").
        `decode_spells` (with `cap_by_power`): a step with prefill counts the busy engine's
        decode-only share at its own weight (module doc, "Decode spells"); False: the decode share
        only through the pause check's after-decode run, as before session 20; "spin" (opt-in): where
        the profile's sustained_mixed run timed its step with no pause as well, no decode spell, and a
        step with prefill launched behind another pays that run's no-pause level instead (module doc,
        "The busy level"; `busy_level`); elsewhere as True.
        `spread_points`: the profile's decode points of unequal contexts (`decode_context_lens`),
        kept out of the fit and the residuals; `decode_spread`: "measured" (the default: decode-only
        steps charged for their contexts' spread at the kappa those points give, none without
        them), "off", or a kappa (a what-if on any profile; module doc, "Unequal contexts");
        `mixed_spread`: "measured" (the default: steps with prefill charged for their decodes'
        spread at the kappa the profile's mixed spread points give, `from_json`; none without them),
        "off", or a kappa (a what-if wherever the decode term has a launch plan; module doc,
        "Unequal contexts beside a chunk").
        `mixed_tiles`: "measured" (the default since session 35) charges a step with prefill for
        the fraction of its decodes' last attention tiles the profile's tile-edge pairs measure on a
        CUDA profile (`set_tile_pairs`; none without them, none on the CPU, whose attention is not
        tiled), "on" for their whole tiles (`MIXED_BLOCK_N` context tokens each), "off" at their
        contexts (module doc, "Whole tiles beside a chunk").
        `decode_tiles`: "measured" (the default since session 35: the pairs' decode-only fraction,
        as above), "off", or a fraction in [0, 1] (a what-if): decode-only steps charged c + phi x
        (the tokens to the decode launch's tile end) for each decode (same section).
        `prefix_term`: "twins" (the default) sets the cached-prefix term h from the prefix points
        against their start-0 twins alone and keeps Σp_i·s_i out of the residuals; "fit" as before
        session 26 (h one coefficient of the regression, Σp_i·s_i a residual axis; module doc,
        "The prefix term from twins"). A profile without twins is fitted as "fit" either way.
        `cap_onset`: "slow" (the default) reads the busy shares with the sustained trace's one time
        constant; "fast" splits the factor between the limiter's fast onset and its slow drift, each
        share with its own time constant, and counts no decode spell (module doc, "The limiter's
        onset"; with `power_cap` and a trace that resolves it, else as "slow"); "delay" charges a step
        with prefill its kind's streamed level once its run of such steps has lasted the card's delay,
        in place of every other cap term (module doc, "The delayed onset"; with `power_cap` and a profile
        that measured it, else as "slow").
        `cap_sag` (with `power_cap`, where the pause check's "stream_mixed" run has its bins): the
        limiter's slow sag past the sustained runs' horizon, charged from a third share at its own
        time constant (module doc, "The slow sag"); False: none, as before session 28.
        `cap_anchors`: "sustained" (the default) takes the cap's ratios (the pause check step's r, the
        mixed and packed anchors') from the sustained runs' wall times; "stream" (opt-in) from the
        pause check's "stream_kind" runs where the profile has them, each kind paused and back to
        back in device time (module doc, "Anchors in device time"); the time constants stay the
        sustained traces'."""
        if cap_anchors not in ("sustained", "stream"):
            raise ValueError(f"cap_anchors {cap_anchors!r}: sustained or stream")
        if cap_onset not in ("slow", "fast", "delay"):
            raise ValueError(f"cap_onset {cap_onset!r}: slow, fast or delay")
        # (knee_support: the step sizes a compute knee needs past it, KNEE_SUPPORT; 0: any knee, as
        # before session 27)
        if prefix_term not in ("twins", "fit"):
            raise ValueError(f"prefix_term {prefix_term!r}: twins or fit")
        if mixed_spread not in ("measured", "off"):
            try:
                mixed_spread = float(mixed_spread)
            except (TypeError, ValueError):
                raise ValueError(f"mixed_spread {mixed_spread!r}: measured, off or a kappa >= 1") from None
            if not mixed_spread >= 1.0:
                raise ValueError(f"mixed_spread {mixed_spread!r}: measured, off or a kappa >= 1")
        self.mixed_spread = mixed_spread
        if mixed_tiles not in ("on", "off", "measured"):
            raise ValueError(f"mixed_tiles {mixed_tiles!r}: on, off or measured")
        # the fraction of a whole tile a decode's partial last tile is charged beside a chunk: 1.0
        # ("on"), 0.0 ("off"), or the profile's tile-edge pairs' ("measured", `set_tile_pairs`)
        self.mixed_tiles_mode = mixed_tiles
        self.mixed_tiles = 1.0 if mixed_tiles == "on" else 0.0
        self.tile_edge_points: list[dict] = []
        self.tile_fractions: dict[str, float] = {}
        if decode_tiles not in ("off", "measured"):
            try:
                decode_tiles = float(decode_tiles)
            except (TypeError, ValueError):
                raise ValueError(f"decode_tiles {decode_tiles!r}: off, measured or a fraction in [0, 1]") from None
            if not 0.0 <= decode_tiles <= 1.0:
                raise ValueError(f"decode_tiles {decode_tiles!r}: off, measured or a fraction in [0, 1]")
        self.decode_tiles_mode = decode_tiles
        self.decode_tiles = decode_tiles if isinstance(decode_tiles, float) else 0.0
        if decode_extrapolation not in ("slope", "nearest"):
            raise ValueError(f"decode_extrapolation {decode_extrapolation!r}: slope or nearest")
        points = np.asarray(points, dtype=np.float64)
        points = points.reshape(-1, points.shape[-1] if points.ndim == 2 else 3)
        if points.shape[1] not in (3, 4, 5, 6):
            raise ValueError(f"profile points need 3-6 columns, not {points.shape[1]}")
        times_s = np.asarray(times_s, dtype=np.float64)
        self.hides_launch = bool(hide_launch and launch_times_s is not None)
        # power cap (module doc): (f_ref, r) from the pause check, or None (off)
        self.power_cap_window_s = None
        self.power_cap_tau_s = None  # the sustained trace's time constant (exponential shares)
        self.sustained_fit = None
        self._cap = None
        self._cap_step = None
        self._cap_share_ref = None  # the reference step's compute share (cap_by_compute)
        self._check_r = None  # the pause check step's own sustained ratio (unclamped)
        self._cap_weight = None  # (rate_ref, token rates, weights) of cap_weight, or None
        if decode_spells not in (True, False, "spin"):
            raise ValueError(f"decode_spells is True, False or 'spin', not {decode_spells!r}")
        self._decode_spells = bool(decode_spells)
        # the busy level (module doc, "The busy level"): the sustained_mixed step's device time with no
        # pause over its paused one, where the profile has both and the model was asked for it; else None
        self.busy_level = None
        if decode_spells == "spin" and power_cap:
            run = next((r for r in ((meta or {}).get("pause_check") or {}).get("runs", [])
                        if r.get("run") == "sustained_mixed"), None) or {}
            if run.get("spin_device_ms_median") and run.get("paused_device_ms_median"):
                self.busy_level = float(run["spin_device_ms_median"]) / float(run["paused_device_ms_median"])
                self._decode_spells = False
        self.cap_onset = None  # the fast onset's fit (`fit_cap_onset`) with its f_ref, or None
        self.cap_sag = None  # the slow sag's fit (`fit_stream_sag`) with its references, or None
        self._onset_trace = None  # (trace t_s, trace ms, paused ms, pause_s) of the factor's reference
        self.cap_mixed = None
        self.cap_packed = None  # the "sustained_packed" anchor (module doc, "Power by step kind")
        check = (meta or {}).get("pause_check") if power_cap else None
        mixed_run = next((r for r in (check or {}).get("runs", []) if r.get("run") == "sustained_mixed"
                          and r.get("paused_ms_median")), None) if cap_by_power else None
        packed_run = next((r for r in (check or {}).get("runs", []) if r.get("run") == "sustained_packed"
                           and r.get("paused_ms_median")), None) if cap_by_power else None
        # the kinds' device-time ratios (module doc, "Anchors in device time"), or {}
        kind_runs = ({r["kind"]: r for r in (check or {}).get("runs", [])
                      if r.get("run") == "stream_kind" and r.get("ratio")} if cap_anchors == "stream" else {})
        kinds = {k: float(r["ratio"]) for k, r in kind_runs.items()}
        # the kinds between the anchors, placed by their own shapes (runs since they carry one)
        self._extra_anchors = [(k, tuple(int(x) for x in r["shape"]), float(r["ratio"]))
                               for k, r in kind_runs.items()
                               if k in EXTRA_ANCHOR_KINDS and len(r.get("shape") or ()) == 5]
        self.cap_anchors = None  # the device-time ratios the cap took, where it took any
        if kinds:
            mixed_run = _anchored(mixed_run, kinds.get("mixed"))
            packed_run = _anchored(packed_run, kinds.get("packed"))
        if check:
            runs = {r["run"]: r["step_ms_median"] for r in check.get("runs", []) if "step_ms_median" in r}
            paused = [runs[k] for k in ("paused", "paused_again") if k in runs]
            pause_s = float((meta or {}).get("pause_ms", 0.0)) / 1e3
            trace = next((r for r in check.get("runs", []) if r.get("run") == "sustained"
                          and r.get("trace_ms")), None)
            fit = (fit_sustained_trace(np.asarray(trace["trace_t_ms"]) / 1e3, trace["trace_ms"])
                   if trace is not None and paused and pause_s > 0 else None)
            if fit is not None:
                # the trace (module doc): r from its fully busy level, shares averaged with its tau
                base = sum(paused) / len(paused)
                tau = fit["tau_s"]
                f_ref = ewma_duty_ref(base / 1e3, pause_s, tau)
                r = kinds["prefill"] if "prefill" in kinds else fit["steady_ms"] / base
                # after_decode: its pauses ran decode steps, the engine never idle: g = 1 - f
                g_ref = 1.0 - f_ref
                r_dec = (1.0 + (runs["after_decode"] / base - 1.0) / g_ref
                         if "after_decode" in runs and g_ref > 0 else 1.0)
                self._cap = (f_ref, max(r, 1.0), max(r_dec, 1.0))
                self.power_cap_tau_s = tau
                # spans older than 6 tau weigh < 0.25%: the event loop drops them
                self.power_cap_window_s = 6.0 * tau
                self.sustained_fit = {**fit, "r": r, "f_ref": f_ref}
                self._onset_trace = (np.asarray(trace["trace_t_ms"]) / 1e3, trace["trace_ms"], base, pause_s)
                self._cap_step = (int(check.get("num_prefill_tokens", 512)),
                                  max(1, int(check.get("num_prefill_seqs", 1))))
                self._check_r = r
            elif paused and "back_to_back" in runs and 0 < pause_s < POWER_CAP_WINDOW_S:
                base = sum(paused) / len(paused)
                # a fully busy window: the step after a sustained busy period where the profile
                # ran one (its back-to-back run lasts ten steps, 63 ms on the 6.7B: shorter than
                # the limiter's response; issue 35, session 14), else the back-to-back run's
                r = max(runs["back_to_back"], runs.get("sustained", 0.0)) / base
                # after_decode: the pause ran decode steps, a share g = pause / W of the window
                g_ref = pause_s / POWER_CAP_WINDOW_S
                r_dec = 1.0 + (runs["after_decode"] / base - 1.0) / g_ref if "after_decode" in runs else 1.0
                self._cap = (1.0 - pause_s / POWER_CAP_WINDOW_S, max(r, 1.0), max(r_dec, 1.0))
                self.power_cap_window_s = POWER_CAP_WINDOW_S
                # the pause check's step (its compute share is set once the fit is done)
                self._cap_step = (int(check.get("num_prefill_tokens", 512)),
                                  max(1, int(check.get("num_prefill_seqs", 1))))
                self._check_r = r
        # the pause check's step (the factor's reference unless `_packed_reference` moves it)
        self._check_step = self._cap_step
        self._launch_coef = None
        if launch_times_s is not None:
            launch = np.asarray(launch_times_s, dtype=np.float64)
            lf = np.stack([np.ones_like(launch), points[:, 0], points[:, 1]], axis=-1)
            lscale = np.maximum(np.abs(lf).max(axis=0), 1e-12)
            self._launch_coef = nnls(lf / lscale, launch)[0] / lscale
            if self.hides_launch:
                times_s = times_s - launch
        # the device time of a step queued behind device work (module doc, "Device time"): what a
        # back-to-back step costs, measured rather than inferred from the wall time
        self.fits_device_time = bool(self.hides_launch and device_times_s is not None)
        if self.fits_device_time:
            device = np.asarray(device_times_s, dtype=np.float64)
            if device.shape != times_s.shape:
                raise ValueError(f"{device.shape[0]} device times for {times_s.shape[0]} points")
            times_s = device
        if len(points) < 2:
            raise ValueError("a profile needs at least two measured points")
        d, p, c = points[:, 0], points[:, 1], points[:, 2]
        k = points[:, 3].copy() if points.shape[1] > 3 else (p > 0).astype(np.float64)
        k[p <= 0] = 0.0
        k[(p > 0) & (k < 1)] = 1.0
        s = points[:, 4] * (p > 0) if points.shape[1] > 4 else np.zeros_like(p)
        # verify points (`num_draft_tokens` v): their k chunks of p / k tokens were verifies of
        # p / k - 1 drafts each, the same tokens through the model as a prefill chunk but sampled
        # at every position; they fit a term per draft token and are told apart in the residuals
        v = points[:, 5] * (p > 0) if points.shape[1] > 5 else np.zeros_like(p)
        q = np.where(k > 0, p * p / np.maximum(k, 1.0), 0.0)  # k equal chunks: Σp_i² = p²/k
        x = p * s                                               # Σp_i·s_i
        # a step with prefill tokens runs the mixed-step graph (cuBLAS GEMMs, prefill attention)
        # where a decode-only step runs the decode graph (one-row GEMVs): on the H200 a 9-token
        # chunk beside one decode cost 3.2 ms more than the decode alone, ~20 times what 8 more
        # tokens cost at that size. Without its own constant that step is fitted as a slope of
        # the tokens, which pulls every decode-only step down (ours: 1.9 ms, 10%, at 8 decodes)
        # (identified only by steps of a few prefill tokens: a profile whose smallest chunk is
        # 512 tokens would put the line's intercept there and charge a 9-token chunk 30 ms)
        mixed_col = bool(((p <= 0) & (d > 0)).any() and ((p > 0) & (p <= 64)).any()
                         and len(np.unique(p[p > 0])) >= 2)
        self._cols = (bool((k > 1).any()), bool((s > 0).any()), mixed_col, None, bool((v > 0).any()))
        self.token_buckets = np.array(sorted(token_buckets), dtype=np.float64) if token_buckets else None
        pad = _pad_tokens(d, p, self.token_buckets)
        # decode points at a bucket's first batches (module doc) are left out of the regression
        # (a line in d through the buckets' jumps would move its constant, and with it every
        # step's compute share: +1.1% on the 33B's prefill steps) and kept for the interpolation
        dec_buckets = (decode_buckets if decode_buckets is not None
                       else (meta or {}).get("cuda_graph_decode_buckets"))
        firsts = _first_batches(dec_buckets)
        fit = np.ones(len(d), dtype=bool)
        if firsts & {int(x) for x in d[p <= 0]}:
            fit = ~((p <= 0) & np.isin(d, sorted(firsts)))
        else:
            dec_buckets = None
        # budget-filling packed points (module doc, "Budget-filling packed steps"): left out of the
        # regression, kept for the interpolation
        self.num_budget_points = 0
        single = (p > 0) & (d > 0) & (k <= 1) & (s <= 0) & (v <= 0)
        if single.any():
            budget = (p > 0) & (d > 0) & (k > 1) & (s <= 0) & (v <= 0) & (p > p[single].max())
            fit &= ~budget
            self.num_budget_points = int(budget.sum())
        # the cached-prefix term from the prefix points' start-0 twins (module doc): fixed before
        # the regression, which then fits the times less h·Σp_i·s_i with that column at zero
        self.prefix_twins = (_twin_prefix_slope(d, p, c, k, q, s, v, pad, times_s, self._cols, fit)
                             if self._cols[1] and prefix_term == "twins" else None)
        x_fit = x if self.prefix_twins is None else np.zeros_like(x)
        t_fit = times_s if self.prefix_twins is None else times_s - self.prefix_twins["h_s"] * x
        if mixed_col and len(np.unique(p[p > 0])) >= 3:
            # a mixed step's matrix products stream the weights (flat in its tokens) until they
            # turn compute-bound; one slope for both charged 8 more tokens at 9 as 0.7 ms where
            # the H200 took 0.1 ms. The knee is the step size (a measured one) that fits best
            tokens = (d + p + pad)[p > 0]
            # a knee needs support past it (KNEE_SUPPORT): points just past a knee near the grid's
            # top gave its slope from their own noise (the H100 6.7B mixed profiles: knee 1,536,
            # the fit's points past it reaching 1,664 tokens, 40 us a token past it against 11
            # below, which charged a 2,016-token chunk 72 ms where it took 49;
            # bench/results/fidelity_onset_s27)
            fit_tokens = np.unique((d + p + pad)[(p > 0) & fit])
            top = float(tokens.max())
            best = None
            for knee in np.unique(tokens)[:-1]:
                past = fit_tokens[fit_tokens > knee]
                if knee_support and (len(past) < knee_support or past.max() - knee < (top - knee) / 2):
                    continue
                f = _features(d, p, c, k, q, x_fit, self._cols[:3] + (float(knee),) + self._cols[4:],
                              pad, v)
                fs = np.maximum(np.abs(f).max(axis=0), 1e-12)
                sse = float(((f[fit] @ (nnls(f[fit] / fs, t_fit[fit])[0] / fs) - t_fit[fit]) ** 2).sum())
                if best is None or sse < best[0]:
                    best = (sse, float(knee))
            if best is not None:
                self._cols = self._cols[:3] + (best[1],) + self._cols[4:]
        self.points = points[:, :3]
        self.num_prefill_seqs, self.prefill_context_len, self.num_draft_tokens = k, s, v
        self.times_s, self.meta = times_s, dict(meta or {})
        self._blocks, self._block_size = num_blocks, block_size
        feats = _features(d, p, c, k, q, x_fit, self._cols, pad, v)
        scale = np.maximum(np.abs(feats).max(axis=0), 1e-12)
        coef, _ = nnls(feats[fit] / scale, t_fit[fit])
        self.coef = coef / scale
        feats = _features(d, p, c, k, q, x, self._cols, pad, v)
        if self.prefix_twins is not None:  # the Σp_i·s_i column: after [1, d, p, ctx, Σp²] and k's
            self.coef[5 + int(self._cols[0])] = self.prefix_twins["h_s"]
        resid = times_s - feats @ self.coef
        ss_tot = float(((times_s - times_s.mean()) ** 2).sum())
        self.r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
        # residuals live in (d, p, ctx), plus Σp_i² / Σp_i·s_i when the profile varies them apart
        # from p (otherwise a packed step and one long prompt of the same p would be one point);
        # decode-only steps and steps with prefill are interpolated apart (two kinds of step, two
        # graphs: a decode step must not take a prefill point's residual)
        # (with the twins' prefix term Σp_i·s_i is no axis, and the prefix points, whose shapes but
        # for the prefix are their twins', are no residual points: near-twins with their own noise
        # would make the surface steep in ctx, where the prefix is 0.3% of it)
        self._resid_x = self._cols[1] and self.prefix_twins is None
        space = np.stack([d, p, c] + ([q] if self._cols[0] else []) + ([x] if self._resid_x else [])
                         + ([v] if self._cols[4] else []), axis=-1)
        has_prefill = p > 0
        in_prefill = has_prefill & (s <= 0) if self.prefix_twins is not None else has_prefill
        self._resid_decode = _residual_interpolator(space[~has_prefill][:, [0, 2]], resid[~has_prefill])
        self._resid_prefill = _residual_interpolator(space[in_prefill], resid[in_prefill])
        self._decode_segs = _bucket_segments(dec_buckets, d[~has_prefill], space[~has_prefill][:, [0, 2]],
                                             resid[~has_prefill])
        # decode-only steps past the largest measured decode batch (module doc, "Past the
        # measured decode batches"): (d_lo, d_max) of the line they follow, or None
        self._decode_tail = (_decode_tail(d[~has_prefill], dec_buckets if dec_buckets is not None
                                          else (meta or {}).get("cuda_graph_decode_buckets"))
                             if decode_extrapolation == "slope" else None)
        self.ctx_quantum = max(1, int(ctx_quantum))
        self._memo: dict[tuple, float] = {}
        # the fit's constant: what a step costs whatever it holds (the weights' read)
        self._const_s = max(0.0, float(_features(0, 0, 0, 0, 0, 0, self._cols, 0, 0) @ self.coef))
        if self._cap is not None and cap_by_compute:
            n, k = self._cap_step
            ref = self.compute_share(0, n, n, [n // k] * k)
            self._cap_share_ref = ref if ref > 0 else None
        if self._cap is not None and packed_run is not None:
            self._set_cap_weight(mixed_run, packed_run, float((meta or {}).get("pause_ms", 0.0)) / 1e3)
        elif self._cap is not None and mixed_run is not None and self._cap[1] > 1.0:
            self._set_cap_weight(mixed_run)
        if (cap_onset == "fast" and self._cap is not None and self._cap[1] > 1.0
                and self._onset_trace is not None and self.power_cap_tau_s):
            t_s, ms, paused_ms, pause_s = self._onset_trace
            onset = fit_cap_onset(t_s, ms, paused_ms, self.power_cap_tau_s)
            if onset is not None:
                onset["f_ref"] = ewma_duty_ref(paused_ms / 1e3, pause_s, onset["tau_fast_s"])
                self.cap_onset = onset
        if kinds and self._cap is not None:
            self.cap_anchors = {k: v for k, v in kinds.items()
                                if k in ("prefill", "mixed", "packed") + EXTRA_ANCHOR_KINDS}
        stream = next((r for r in (check or {}).get("runs", []) if r.get("run") == "stream_mixed"
                       and r.get("bins")), None)
        if cap_sag and self._cap is not None and self.power_cap_tau_s and stream is not None:
            self._set_cap_sag(stream, float((meta or {}).get("pause_ms", 0.0)) / 1e3)
        # the delayed onset (module doc, "The delayed onset"): in place of every other cap term, where measured
        self.cap_delay = None
        if cap_onset == "delay" and self._cap is not None:
            spec = fit_cap_delay(meta or {})
            if spec is not None:
                d0, p0, c0 = spec["shape"][:3]
                share = self.compute_share(d0, p0, d0 * c0 + p0)
                if share > 0:
                    # before the delay a step launched behind another pays the busy level (module doc, "The
                    # busy level": the sustained_mixed step's no-pause over paused device time), where measured
                    mixed_run = next((r for r in (check or {}).get("runs", []) if r.get("run") == "sustained_mixed"),
                                     None) or {}
                    busy = (float(mixed_run["spin_device_ms_median"]) / float(mixed_run["paused_device_ms_median"])
                            if mixed_run.get("spin_device_ms_median") and mixed_run.get("paused_device_ms_median")
                            else 1.0)
                    self.cap_delay = {**spec, "compute_share_stream": share, "busy_level": busy}
                    self._cap = self._cap_share_ref = self._cap_weight = None
                    self.power_cap_window_s = self.power_cap_tau_s = None
                    self.cap_mixed = self.cap_packed = self.cap_onset = self.cap_sag = self.cap_anchors = None
                    self.busy_level = None
        self.mixed_spread_points: list[dict] = []  # from_json: spread points beside a chunk
        self._set_decode_spread(spread_points or [], decode_spread)
        self.mixed_point_kappas: list[dict] = []
        self._mixed_kappa_by_d = None  # (log d, kappa) of the mixed spread points, or None: no term
        self._mixed_memo: dict[tuple, float] = {}
        self._mixed_even_memo: dict[tuple, float] = {}
        self.mixed_plan = None

    def _set_decode_spread(self, spread_points: list[dict], decode_spread: str | float) -> None:
        """kappa and the launch plan of the unequal-contexts term (module doc, "Unequal
        contexts"): from the spread points, each read as the multiple of its total context at
        which the fitted model gives its measured time (the time the fit used: device, or step
        minus launch, or step), then `solve_kappa`; their median is the model's."""
        self.decode_plan = None
        self.spread_kappa = None
        self.spread_point_kappas: list[dict] = []
        self._spread_memo: dict[tuple, float] = {}
        self._even_memo: dict[tuple, float] = {}
        self._kappa_by_d = None   # (log d, kappa) of the spread points, or None: one kappa
        if decode_spread == "off":
            return
        if self.meta.get("decode_attention"):  # named by the profile: its plan or (not Triton) none
            plan = DecodeLaunchPlan.from_profile(self.meta)
        else:
            plan = _legacy_launch_plan(self.meta)
        if plan is None:
            return
        if decode_spread != "measured":
            kappa = float(decode_spread)
            if not kappa >= 1.0:
                raise ValueError(f"decode_spread {decode_spread!r}: 'measured', 'off' or a kappa >= 1")
            self.decode_plan, self.spread_kappa = plan, kappa
            return
        for pt in spread_points:
            ctxs = expand_context_lens(pt["decode_context_lens"])
            d, total = len(ctxs), sum(ctxs)
            t = self._fit_time(pt)
            factor = self._context_multiple(d, total, t)
            kappa = solve_kappa(ctxs, plan, factor)
            self.spread_point_kappas.append({"num_decode_seqs": d, "decode_context_lens": pt["decode_context_lens"],
                                             "ms": round(t * 1e3, 4), "uniform_model_ms": round(self._eval(d, 0, total, 0, 0, 0) * 1e3, 4),
                                             "context_multiple": round(factor, 4), "kappa": kappa})
        kappas = [k["kappa"] for k in self.spread_point_kappas]
        if kappas:
            self.decode_plan = plan
            self.spread_kappa = float(np.median(kappas))  # inf where no point saw a cap
            # each point's kappa at its batch, interpolated in log d between them (held past the
            # ends): a launch of one wave (d <= 16 on the 6.7B) and one of several need not share
            # it; a point that saw no cap counts at the solve's bound (64: no cap in effect)
            by_d = sorted((k["num_decode_seqs"], min(k["kappa"], 64.0)) for k in self.spread_point_kappas)
            self._kappa_by_d = (np.log([d for d, _ in by_d]), np.array([k for _, k in by_d]))

    def _fit_time(self, pt: dict) -> float:
        """Seconds of a point kept out of the fit (a spread point), as the fit reads its points:
        device time, or step minus launch, or step."""
        if self.fits_device_time and pt.get("device_ms_median") is not None:
            return float(pt["device_ms_median"]) / 1e3
        t = float(pt["step_ms"]) / 1e3
        if self.hides_launch and pt.get("launch_ms_median") is not None:
            t -= float(pt["launch_ms_median"]) / 1e3
        return t

    def _context_multiple(self, d: int, total: int, t: float) -> float:
        """The x with the model's decode-only time at d sequences and x * total context = t
        (bisection: the time rises with the context), from 1/8 to 8."""
        lo, hi = 0.125, 8.0
        if self._eval(d, 0, total * lo, 0, 0, 0) >= t:
            return lo
        if self._eval(d, 0, total * hi, 0, 0, 0) <= t:
            return hi
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            if self._eval(d, 0, total * mid, 0, 0, 0) < t:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    @property
    def charges_decode_spread(self) -> bool:
        """Decode-only steps are charged for their contexts' spread (`decode_context_multiple`)."""
        if self.decode_plan is not None and self.decode_tiles:
            return True  # their partial tiles (`decode_tiles`), with or without the spread's kappa
        return self._spread_charges()

    def _spread_charges(self) -> bool:
        """The spread points gave a kappa that charges (or a what-if kappa was set)."""
        if self.decode_plan is None or self.spread_kappa is None:
            return False
        return bool(np.isfinite(self.spread_kappa)
                    or (self._kappa_by_d is not None and (self._kappa_by_d[1] < 64.0).any()))

    def kappa_at(self, d: int) -> float:
        """The launch model's kappa for a decode step of d sequences: the spread points' own,
        interpolated in log d, or the one kappa given (a what-if)."""
        if self._kappa_by_d is None:
            return self.spread_kappa
        x, k = self._kappa_by_d
        return float(np.interp(np.log(max(d, 1)), x, k))

    def decode_context_multiple(self, contexts) -> float:
        """What a decode-only step of these contexts (launch order) costs, as a multiple of its
        total context: the attention launch's time over its time at their mean (`spread_factor`),
        memoized on the contexts in the plan's tiles (the kernel reads whole tiles); with
        `decode_tiles`, times their partial tiles' share (module doc, "Whole tiles beside a chunk")."""
        if not self.charges_decode_spread or not len(contexts):
            return 1.0
        bn = self.decode_plan.block_n
        g = 1.0
        if self.decode_tiles:
            total = sum(int(c) for c in contexts)
            g = (total + self.decode_tiles * tile_pad(contexts, bn)) / max(1, total)
        if len(contexts) < 2 or not self._spread_charges():
            return g
        key = tuple(-(-int(c) // bn) for c in contexts)
        f = self._spread_memo.get(key)
        if f is None:
            if len(self._spread_memo) > 200_000:
                self._spread_memo.clear()
            f = self._spread_memo[key] = spread_factor([k * bn for k in key], self.decode_plan,
                                                       self.kappa_at(len(key)), self._even_memo)
        return f * g

    def set_tile_edges(self, points: list[dict], max_context: int | None = None) -> None:
        """The fraction of a whole tile a partial one costs, from the profile's off-edge points (every
        decode one token past a tile edge; module doc, "Whole tiles beside a chunk"): each point's
        context at which the fitted model gives its time (the time the fit used), as total + phi x
        the tokens to its decodes' tile ends; phi per point, its median per kind ("mixed": beside a
        chunk, at `MIXED_BLOCK_N`; "decode": alone, at the decode launch's tile). Recorded in
        `tile_fractions` and the model's summary, not charged (since session 35 "measured" charges
        the tile-edge pairs' fractions only, `set_tile_pairs`). A point whose decodes' tile ends past
        `max_context` (the grid's longest decode context) is not read: the fit has no measured
        neighbour there (a CPU profile's short grid)."""
        self.tile_edge_points, self.tile_fractions = [], {}
        for pt in points:
            ctxs = expand_context_lens(pt["decode_context_lens"])
            d, total = len(ctxs), sum(ctxs)
            p = int(_pick(pt, _P_KEYS, 0))
            k, st = int(_pick(pt, _K_KEYS, 1) or 1), int(_pick(pt, _S_KEYS, 0))
            if d < 1 or (p and p % k):
                continue
            bn = MIXED_BLOCK_N if p else (self.decode_plan.block_n if self.decode_plan else MIXED_BLOCK_N)
            pad = tile_pad(ctxs, bn)
            if pad <= 0 or (max_context and max(-(-c // bn) * bn for c in ctxs) > max_context):
                continue
            t = self._fit_time(pt)
            if p:
                chunks = [(p // k, st)] * k
                x = self._mixed_context_multiple(d, p, total, p + k * st, chunks, t)
            else:
                x = self._context_multiple(d, total, t)
            self.tile_edge_points.append({"kind": "mixed" if p else "decode", "num_decode_seqs": d,
                                          "num_prefill_tokens": p, "decode_context_lens": pt["decode_context_lens"],
                                          "block_n": bn, "ms": round(t * 1e3, 4),
                                          "tile_fraction": round((x - 1.0) * total / pad, 4)})
        for kind in ("mixed", "decode"):
            fr = [e["tile_fraction"] for e in self.tile_edge_points if e["kind"] == kind]
            if fr:
                self.tile_fractions[kind] = round(float(np.median(fr)), 4)
        # recorded, not charged: read against the fit these are its residual's size (module doc,
        # "Whole tiles beside a chunk"); "measured" charges the pairs' fractions only

    def set_tile_pairs(self, pairs: list[dict], max_context: int | None = None) -> None:
        """The fraction of a whole tile a partial one costs, from the profile's tile-edge pairs
        (`bench.engine.profile.tile_edge_pairs`: every decode on a tile edge, one token past it and,
        since the second form, at the next edge, timed in turn). Per kind ("mixed": beside a chunk,
        at `MIXED_BLOCK_N`; "decode": alone, at the decode launch's tile) the pooled ratio of what the
        pairs measured off - on, less the one token's own cost, to what a whole tile over the off
        twin's partial one costs; so the larger batches, whose tiles cost the most, weigh the most.
        The whole tile is measured where the pair has its next twin (`whole_ms_median`, next - on,
        scaled to the tile's tokens), else charged at the fit's linear context cost (`coef` e a token;
        not the whole surface: its slope between the grid's contexts is the grid points' noise).
        Replaces what `set_tile_edges` read. A pair whose tile ends past `max_context` (the grid's
        longest decode context) is not read where the whole tile is not measured."""
        rows = []
        e_s = float(self.coef[3]) if len(self.coef) > 3 else 0.0  # _FEATURE_NAMES[3]: s a context token
        for pr in pairs:
            d, p = int(pr["num_decode_seqs"]), int(pr.get("num_prefill_tokens", 0))
            on, off = int(pr["on_context"]), int(pr["off_context"])
            if d < 1 or pr.get("diff_ms_median") is None:
                continue
            bn = MIXED_BLOCK_N if p else (self.decode_plan.block_n if self.decode_plan else MIXED_BLOCK_N)
            tokens = tile_pad([off] * d, bn) - tile_pad([on] * d, bn)  # a whole tile past the partial one's key
            nxt, whole_meas = pr.get("next_context"), pr.get("whole_ms_median")
            if nxt is not None and whole_meas is not None and int(nxt) > on:
                per_token = float(whole_meas) / 1e3 / (d * (int(nxt) - on))
                source = "measured"
            else:
                if max_context and -(-off // bn) * bn > max_context:
                    continue
                per_token, source = e_s, "fit"
            whole = per_token * tokens
            if whole <= 0:
                continue
            measured = float(pr["diff_ms_median"]) / 1e3 - per_token * d * (off - on)
            rows.append({"kind": "mixed" if p else "decode", "num_decode_seqs": d, "num_prefill_tokens": p,
                         "block_n": bn, "on_context": on, "off_context": off, "whole_tile": source,
                         "diff_ms": round(float(pr["diff_ms_median"]), 5), "whole_tile_ms": round(whole * 1e3, 5),
                         "tile_fraction": round(measured / whole, 4), "_m": measured, "_w": whole})
        if not rows:
            return
        self.tile_fractions = {}
        for kind in ("mixed", "decode"):
            kr = [r for r in rows if r["kind"] == kind]
            if kr:
                self.tile_fractions[kind] = round(sum(r["_m"] for r in kr) / sum(r["_w"] for r in kr), 4)
        self.tile_edge_points = [{k: v for k, v in r.items() if not k.startswith("_")} | {"source": "pairs"}
                                 for r in rows]
        if not charges_tile_pairs({**self.meta, "tile_edge_pairs": pairs}):
            return  # recorded, not charged: the CPU's attention runs no tiles (the pairs time its noise)
        if self.mixed_tiles_mode == "measured":
            self.mixed_tiles = min(1.0, max(0.0, self.tile_fractions.get("mixed", 0.0)))
        if self.decode_tiles_mode == "measured":
            self.decode_tiles = min(1.0, max(0.0, self.tile_fractions.get("decode", 0.0)))

    def set_mixed_spread(self, points: list[dict]) -> None:
        """The mixed steps' unequal-contexts term from the profile's mixed spread points (module
        doc, "Unequal contexts beside a chunk"): each point's decode-context multiple at which the
        fitted model gives its time (the time the fit used), solved for kappa on the decode launch
        plan without splits (`mixed_plan`). Nothing where the term is off, the decode term has no
        plan, or no point reads."""
        self.mixed_spread_points = list(points)
        self.mixed_point_kappas, self._mixed_kappa_by_d, self._mixed_memo = [], None, {}
        self.mixed_plan = None
        if self.mixed_spread == "off" or self.decode_plan is None:
            return
        # a step with prefill runs the paged kernel tiled for queries and split by the mixed rule
        # (backend.kernels.paged_attention.choose_num_splits, resident_per_sm None: at least
        # PROGRAMS_PER_SM programs a SM, which a 256-token chunk's query blocks give by
        # themselves): one split, a long decode's programs over its whole context
        plan = self.mixed_plan = replace(self.decode_plan, splits=(1,) * len(self.decode_plan.splits))
        if isinstance(self.mixed_spread, float):  # a what-if: one kappa at every batch
            self._mixed_kappa_by_d = (np.log([1.0]), np.array([self.mixed_spread]))
            return
        for pt in self.mixed_spread_points:
            ctxs = expand_context_lens(pt["decode_context_lens"])
            d, total = len(ctxs), sum(ctxs)
            p = int(_pick(pt, _P_KEYS, 0))
            k, st = int(_pick(pt, _K_KEYS, 1) or 1), int(_pick(pt, _S_KEYS, 0))
            if d < 2 or p <= 0 or p % k:
                continue
            chunks = [(p // k, st)] * k
            t = self._fit_time(pt)
            rest = p + k * st  # the chunks' own context, as the event loop passes it
            factor = self._mixed_context_multiple(d, p, total, rest, chunks, t)
            kappa = solve_kappa(ctxs, plan, factor)
            self.mixed_point_kappas.append({"num_decode_seqs": d, "num_prefill_tokens": p,
                                            "decode_context_lens": pt["decode_context_lens"],
                                            "ms": round(t * 1e3, 4),
                                            "uniform_model_ms": round(self.step_time(d, p, total + rest, chunks) * 1e3, 4),
                                            "context_multiple": round(factor, 4), "kappa": kappa})
        if self.mixed_point_kappas:
            by_d = sorted((m["num_decode_seqs"], min(m["kappa"], 64.0)) for m in self.mixed_point_kappas)
            self._mixed_kappa_by_d = (np.log([d for d, _ in by_d]), np.array([k for _, k in by_d]))

    def _mixed_context_multiple(self, d: int, p: int, total: int, rest: int, chunks, t: float) -> float:
        """The x with the model's time for d decodes of x * `total` context beside these chunks (their
        own context `rest`) = t (bisection: the time rises with the context), from 1/8 to 8."""
        lo, hi = 0.125, 8.0
        if self.step_time(d, p, int(lo * total) + rest, chunks) >= t:
            return lo
        if self.step_time(d, p, int(hi * total) + rest, chunks) <= t:
            return hi
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if self.step_time(d, p, int(mid * total) + rest, chunks) < t:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    @property
    def charges_mixed_spread(self) -> bool:
        """Steps with prefill are charged a multiple of their decodes' context
        (`mixed_context_multiple`): for their spread, their whole tiles, or both."""
        return self._spread_beside_chunk() or bool(self.mixed_tiles)

    def _spread_beside_chunk(self) -> bool:
        """The mixed spread points gave a kappa that charges (or a what-if kappa was set)."""
        return self._mixed_kappa_by_d is not None and bool((self._mixed_kappa_by_d[1] < 64.0).any())

    def mixed_context_multiple(self, contexts) -> float:
        """What the decodes of these contexts cost a step with prefill, as a multiple of their total
        context: with `mixed_tiles`, their whole tiles over their contexts (module doc, "Whole tiles
        beside a chunk"), times `spread_factor` at the mixed spread points' kappa where the profile
        has them (1.0 for one decode; memoized on the contexts in the plan's tiles)."""
        f = 1.0
        if self.mixed_tiles and len(contexts):
            total = sum(int(c) for c in contexts)
            f = (total + self.mixed_tiles * tile_pad(contexts, MIXED_BLOCK_N)) / max(1, total)
        if not self._spread_beside_chunk() or len(contexts) < 2:
            return f
        bn = self.decode_plan.block_n
        key = tuple(-(-int(c) // bn) for c in contexts)
        g = self._mixed_memo.get(key)
        if g is None:
            if len(self._mixed_memo) > 200_000:
                self._mixed_memo.clear()
            x, k = self._mixed_kappa_by_d
            kappa = float(np.interp(np.log(len(key)), x, k))
            g = self._mixed_memo[key] = spread_factor([t * bn for t in key], self.mixed_plan, kappa,
                                                      self._mixed_even_memo)
        return f * g

    def _set_cap_weight(self, run: dict | None, packed: dict | None = None, pause_s: float = 0.0) -> None:
        """The busy-share weights of steps with prefill from the pause check's "sustained_mixed"
        run (the module doc, "Power by step kind"): the mixed step (d decodes of context c beside
        one p-token chunk) paused and for a sustained spell back to back, r_mix = sustained /
        paused. Its weight w_mix is the busy share at which the factor gives r_mix (a span of it
        back to back holds the share at w_mix), the pause check step's is 1; a step's weight is
        interpolated between them by its token rate (tokens / its time: the rate of its matrix
        products, what their power follows), from 0 at rate 0, held past the end. `packed`: the
        "sustained_packed" run (the grid's largest prefill-only step), a third anchor weighed as
        the mixed one, r_packed = sustained / paused; where the pause check's step does not throttle
        (r <= 1) and it does, it is the factor's reference instead (`_packed_reference`)."""
        r_packed, switched = None, False
        if packed is not None:
            n_p, k_p = int(packed["num_prefill_tokens"]), max(1, int(packed.get("num_prefill_seqs", 1)))
            r_packed, fit_p = _sustained_ratio(packed)
            if self._cap[1] <= 1.0 < r_packed:
                self._packed_reference(n_p, k_p, r_packed, fit_p, float(packed["paused_ms_median"]), pause_s)
                switched = True
                if packed.get("trace_ms") and pause_s > 0:
                    self._onset_trace = (np.asarray(packed["trace_t_ms"]) / 1e3, packed["trace_ms"],
                                         float(packed["paused_ms_median"]), pause_s)
        f_ref, r, _ = self._cap
        if r <= 1.0:  # nothing measured throttles: every step with prefill weighs 1, as before
            return
        share_ref = self._cap_share_ref or 1.0

        def weight(r_kind: float, share: float) -> float:
            # the busy share at which the factor (the reference's line) gives r_kind: a span of
            # that kind back to back holds the share there; f_ref where it does not slow down
            return f_ref + (1.0 - f_ref) * max(0.0, r_kind - 1.0) * share_ref / ((r - 1.0) * max(share, 1e-9))

        # token rates are over the pause check step's (the mixed anchor's as before the packed run)
        n_c, k_c = self._check_step
        rate_ref = n_c / self.step_time(0, n_c, n_c, [n_c // k_c] * k_c)
        w_check = 1.0
        if switched:  # the packed step is the reference: the check step an anchor
            share_c = self.compute_share(0, n_c, n_c, [n_c // k_c] * k_c) if self._cap_share_ref else 1.0
            w_check = weight(self._check_r, share_c)
        pts = [(0.0, 0.0), (1.0, w_check)]
        if run is not None:
            d, p = int(run.get("num_decode_seqs", 0)), int(run["num_prefill_tokens"])
            c = int(run.get("decode_context_len", 0))
            r_mix, _ = _sustained_ratio(run)
            ctx = d * c + p
            share_mix = self.compute_share(d, p, ctx) if self._cap_share_ref else 1.0
            w_mix = weight(r_mix, share_mix)
            rate_mix = (d + p) / self.step_time(d, p, ctx) / rate_ref
            pts.append((rate_mix, w_mix))
            self.cap_mixed = {"num_decode_seqs": d, "num_prefill_tokens": p, "decode_context_len": c,
                              "r_mix": r_mix, "w_mix": w_mix, "rate_mix": rate_mix,
                              "compute_share_mix": share_mix, "whatif": run.get("whatif")}
        if r_packed is not None:
            chunks = [n_p // k_p] * k_p
            share_p = self.compute_share(0, n_p, n_p, chunks) if self._cap_share_ref else 1.0
            w_packed = weight(r_packed, share_p)
            rate_packed = n_p / self.step_time(0, n_p, n_p, chunks) / rate_ref
            pts.append((rate_packed, w_packed))
            self.cap_packed = {"num_prefill_tokens": n_p, "num_prefill_seqs": k_p, "r_packed": r_packed,
                               "w_packed": w_packed, "rate_packed": rate_packed,
                               "compute_share_packed": share_p, "w_check": w_check,
                               "reference": "packed" if switched else "check",
                               "whatif": packed.get("whatif")}
        extra = []
        for name, (d, p, c, k, st), r_kind in self._extra_anchors:
            if p <= 0:
                continue
            chunks = [(p // max(1, k), st)] * max(1, k)
            ctx = d * c + p + st * max(1, k)
            share_k = self.compute_share(d, p, ctx, chunks) if self._cap_share_ref else 1.0
            w_k = weight(r_kind, share_k)
            rate_k = (d + p) / self.step_time(d, p, ctx, chunks) / rate_ref
            pts.append((rate_k, w_k))
            extra.append({"kind": name, "shape": [d, p, c, k, st], "r": r_kind, "w": w_k, "rate": rate_k})
        if extra and self.cap_mixed is not None:
            self.cap_mixed["extra_anchors"] = extra
        pts = sorted(pts)
        self._cap_weight = (rate_ref, np.array([x for x, _ in pts]), np.array([w for _, w in pts]), {})

    def _packed_reference(self, n: int, k: int, r_packed: float, fit: dict | None, paused_ms: float,
                          pause_s: float) -> None:
        """The packed step as the power cap's reference (`_set_cap_weight`): the pause check's
        512-token step does not throttle (r <= 1: the factor has no slope, no weight can give a
        kind's slowdown) but the packed one does (the 6.7B FP8 on the H200, r 0.97). The factor
        becomes the packed run's line: r = r_packed, the time constant its trace's (the limiter's
        response where it acts; the non-throttling trace's is noise), f_ref its paused duty
        (`ewma_duty_ref`); the reference share its compute share, the after_decode term rescaled
        so that the check step's own after_decode ratio is unchanged."""
        f_ref, _, r_dec = self._cap
        if fit is not None and pause_s > 0:
            self.power_cap_tau_s = fit["tau_s"]
            self.power_cap_window_s = 6.0 * fit["tau_s"]
        if self.power_cap_tau_s is not None:
            f_ref = ewma_duty_ref(paused_ms / 1e3, pause_s, self.power_cap_tau_s)
        # else the 100 ms window's f_ref (1 - pause / W), the same for every step
        if self._cap_share_ref is not None:
            share = self.compute_share(0, n, n, [n // k] * k)
            if share > 0:
                r_dec = 1.0 + (r_dec - 1.0) * share / self._cap_share_ref
                self._cap_share_ref = share
        self._cap = (f_ref, r_packed, r_dec)
        self._cap_step = (n, k)

    def _set_cap_sag(self, stream: dict, pause_s: float) -> None:
        """The slow sag (module doc, "The slow sag") from the "stream_mixed" run's bins: its fit
        (`fit_stream_sag`), the stream's mean weight and compute share over its shapes (the share
        and the scale at which it sagged by `sag`), and f_ref, the paused points' share at its time
        constant (the pause check's paused step, as the factor's)."""
        fit = fit_stream_sag(stream["bins"], float(stream.get("bin_s") or 1.0))
        if fit is None or fit["sag"] <= 0:
            return
        # (d, p, c) from 0, or (d, p, c, s): the chunk after a cached prefix of s tokens
        shapes = [(int(x[0]), int(x[1]), int(x[2]), int(x[3]) if len(x) > 3 else 0) for x in stream["shapes"]]
        ws = [self.cap_weight(d, p, d * c + p + s, [(p, s)]) for d, p, c, s in shapes]
        shares = [self.compute_share(d, p, d * c + p + s, [(p, s)]) for d, p, c, s in shapes]
        ref_ms = float(self.sustained_fit["start_ms"]) if self.sustained_fit else None
        paused = [r for r in (self.meta.get("pause_check") or {}).get("runs", []) if r.get("run") == "paused"]
        base_ms = float(paused[0]["step_ms_median"]) if paused else ref_ms
        f_ref = ewma_duty_ref(base_ms / 1e3, pause_s, fit["tau_s"]) if base_ms and pause_s > 0 else 0.0
        w_stream = float(np.mean(ws))
        if w_stream <= f_ref:
            return
        self.cap_sag = {**fit, "w_stream": w_stream, "share_stream": float(np.mean(shares)), "f_ref": f_ref}

    @property
    def power_cap_tau_sag_s(self) -> float | None:
        """The slow sag's time constant (module doc, "The slow sag"), or None."""
        return None if self.cap_sag is None else self.cap_sag["tau_s"]

    @property
    def weights_cap_by_power(self) -> bool:
        """Steps with prefill weigh in the power cap's busy share by their kind's power
        (`cap_weight`): the profile measured the mixed or the packed step's sustained run (and
        one of the measured kinds throttles)."""
        return self._cap_weight is not None

    @property
    def counts_decode_spells(self) -> bool:
        """A step with prefill counts the decode-only share before it at its own weight (module
        doc, "Decode spells"): `weights_cap_by_power` and the model built with `decode_spells`."""
        return self._cap_weight is not None and self._decode_spells and self.cap_onset is None

    @property
    def power_cap_tau_fast_s(self) -> float | None:
        """The limiter's fast onset's time constant (module doc, "The limiter's onset"), or None."""
        return None if self.cap_onset is None else self.cap_onset["tau_fast_s"]

    def cap_weight(self, num_decode_seqs: int, num_prefill_tokens: int, num_context_tokens: int,
                   prefill_chunks=None) -> float:
        """A step's weight in the power cap's busy share (`weights_cap_by_power`; 1.0 for a step
        with prefill without it, 0.0 for a decode-only step, which the decode share counts)."""
        if num_prefill_tokens <= 0:
            return 0.0
        if self._cap_weight is None:
            return 1.0
        rate_ref, xs, ws, memo = self._cap_weight
        t = self.step_time(num_decode_seqs, num_prefill_tokens, num_context_tokens, prefill_chunks)
        key = (num_decode_seqs, num_prefill_tokens, t)
        w = memo.get(key)
        if w is None:
            w = memo[key] = float(np.interp((num_decode_seqs + num_prefill_tokens) / t / rate_ref, xs, ws))
        return w

    @classmethod
    def from_json(cls, path: str | Path, **kwargs) -> ProfileCost:
        doc = json.loads(Path(path).read_text())
        raw = doc if isinstance(doc, list) else (doc.get("points") or doc.get("steps") or [])
        pts, times, launch, device = [], [], [], []
        spread, mixed_spread, edges = [], [], []
        for point in raw:
            runs = point.get("decode_context_lens")
            if runs and point.get("decode_spread") == "off_edge":
                edges.append(point)  # one token past a tile edge: the tiles term's, not the fit's
                continue
            if runs and len({int(c) for _n, c in runs}) > 1:
                # unequal contexts: the spread term's (decode-only), not the fit's; beside a prefill
                # chunk (the mixed spread points, session 20): the mixed steps' term's (session 21)
                (mixed_spread if _pick(point, _P_KEYS, 0) else spread).append(point)
                continue
            launch.append(point.get("launch_ms_median"))
            device.append(point.get("device_ms_median"))
            for key, scale in _TIME_KEYS:
                if key in point:
                    times.append(float(point[key]) * scale)
                    break
            else:
                raise ValueError(f"profile point {point} has no step time")
            p = _pick(point, _P_KEYS, 0)
            pts.append((_pick(point, _D_KEYS), p, _pick(point, _C_KEYS, 0),
                        _pick(point, _K_KEYS, 1 if p else 0) if p else 0, _pick(point, _S_KEYS, 0),
                        point.get("num_draft_tokens", 0)))
        meta = {} if isinstance(doc, list) else {k: v for k, v in doc.items() if k != "points"}
        if "token_buckets" not in kwargs:
            buckets = meta.get("cuda_graph_token_buckets")
            if buckets is None and str(meta.get("device", "")).startswith("cuda"):
                mnbt = meta.get("max_num_batched_tokens") or max(LEGACY_CUDA_TOKEN_BUCKETS)
                buckets = [b for b in LEGACY_CUDA_TOKEN_BUCKETS if b <= mnbt]
            kwargs["token_buckets"] = buckets
        if "launch_times_s" not in kwargs and launch and all(x is not None for x in launch):
            kwargs["launch_times_s"] = np.array(launch, dtype=np.float64) * 1e-3
        # every point timed as the serving loop runs it (module doc, "Device time"), else none
        if "device_times_s" not in kwargs and device and all(x is not None for x in device):
            kwargs["device_times_s"] = np.array(device, dtype=np.float64) * 1e-3
        kwargs.setdefault("spread_points", spread)
        cost = cls(np.array(pts), np.array(times), num_blocks=meta.get("num_kv_blocks"),
                   block_size=meta.get("block_size"), meta=meta, **kwargs)
        cost.set_mixed_spread(mixed_spread)
        # the grid's longest decode context: an off-edge point whose tile ends past it would be read
        # against the fit's extrapolation, not its measured neighbours (`set_tile_edges`)
        grid_c = max((int(q.get("context_len", 0)) for q in raw
                      if _pick(q, _D_KEYS, 0) and not q.get("decode_context_lens")), default=0)
        cost.set_tile_edges(edges, grid_c)
        cost.set_tile_pairs(meta.get("tile_edge_pairs") or [], grid_c)  # where measured, they decide
        return cost

    def _eval(self, d: int, p: int, c: int, k: int, q: int, x: int, v: int = 0, z: int = 0) -> float:
        """The charge of a step: the regression at (d, p, c, ...) plus the residual surface's. `z`
        (with the twins' prefix term): the chunks' prefix tokens Σs_i among the c context tokens,
        which h·Σp_i·s_i and the context term already charge; the residual is read at the twin's
        context c - z, where the surface was measured (the profile's prefix points are its twins
        plus a prefix), not along the decodes' context axis."""
        if p <= 0 and self._decode_tail is not None and d > self._decode_tail[1]:
            # past the measured decode batches: the last measured bucket's line in d at the
            # step's context per sequence (module doc), not the regression's slope
            lo, hi = self._decode_tail
            per_seq = c / d
            t_hi = self._eval(hi, 0, hi * per_seq, 0, 0, 0)
            t_lo = self._eval(lo, 0, lo * per_seq, 0, 0, 0)
            return max(t_hi + (d - hi) * max(0.0, (t_hi - t_lo) / (hi - lo)), 1e-7)
        pad = _pad_tokens(d, p, self.token_buckets)
        t = float(_features(d, p, c, k, q, x, self._cols, pad, v) @ self.coef)
        if p > 0:
            if self._resid_prefill is not None:
                t += self._resid_prefill((d, p, c - z) + ((q,) if self._cols[0] else ())
                                         + ((x,) if self._resid_x else ())
                                         + ((v,) if self._cols[4] else ()))
        elif self._decode_segs is not None and (seg := self._decode_seg(d)) is not None:
            t += seg((d, c))
        elif self._resid_decode is not None:
            t += self._resid_decode((d, c))
        return max(t, 1e-7)

    def _decode_seg(self, d: int):
        """The residual interpolator of the decode bucket a d-sequence step runs (None: past the
        largest bucket, or a bucket without measured points)."""
        edges, segs = self._decode_segs
        i = int(np.searchsorted(edges, d))
        return segs.get(int(edges[i])) if i < len(edges) else None

    @property
    def interpolates_by_decode_bucket(self) -> bool:
        """Decode-only steps are interpolated inside their graph bucket (module doc)."""
        return self._decode_segs is not None

    @property
    def measures_verifies(self) -> bool:
        """The profile timed verify steps (`num_draft_tokens` points): `step_time` charges a
        step's `num_draft_tokens` from them."""
        return bool(self._cols[4])

    def step_time(self, num_decode_seqs: int, num_prefill_tokens: int, num_context_tokens: int,
                  prefill_chunks=None, num_draft_tokens: int = 0) -> float:
        """Seconds of one step. `prefill_chunks` (optional): the step's prefill chunks, each an int
        (tokens from position 0), a (num_tokens, start_pos) pair or an object with `token_ids` and
        `start_pos`; without it the `num_prefill_tokens` are one chunk from position 0. Verifies
        (speculative decoding) are chunks too, of k + 1 tokens at their position;
        `num_draft_tokens`: the drafts among the chunks' tokens (charged only by a profile that
        `measures_verifies`)."""
        if num_decode_seqs + num_prefill_tokens == 0:
            return 0.0
        if prefill_chunks is None:
            p = num_prefill_tokens
            k, q, x, z = (1 if p else 0), p * p, 0, 0
        else:
            p, k, q, x, z = _chunk_shape(prefill_chunks)
        v = num_draft_tokens if self._cols[4] else 0
        z = z if self.prefix_twins is not None else 0
        key = (num_decode_seqs, p, num_context_tokens // self.ctx_quantum, k, q, x, v, z)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = self._eval(num_decode_seqs, p, key[2] * self.ctx_quantum, k, q, x, v, z)
        return t

    def prefill_slowdown(self, busy_share: float, decode_share: float = 0.0,
                         compute_share: float | None = None, fast_share: float | None = None,
                         sag_share: float | None = None) -> float:
        """The power-cap factor of a step with prefill tokens after `busy_share` of the last
        `power_cap_window_s` ran such steps and `decode_share` of it decode-only steps (1.0 with
        the model off). The decode term is the pause check's "after_decode" run (its pause filled
        with decode steps): slower than paused by (r_dec - 1)·g at g = pause / W; profiles
        without that run give r_dec = 1. `compute_share`: the step's (`compute_share`); the
        factor's excess over 1 is scaled by it against the pause check's step's (the module
        doc); None, or a model built with cap_by_compute=False: the pause check's step's own.
        `fast_share`: the busy share at the fast onset's time constant (`power_cap_tau_fast_s`);
        where the model has the onset, the factor's excess is its share phi at that share and the
        rest at `busy_share` (module doc, "The limiter's onset"). `sag_share`: the weighted busy
        share at the slow sag's time constant (`power_cap_tau_sag_s`); where the model has the
        sag, sag (s - f_ref) / (w_stream - f_ref) more, scaled by the step's compute share against
        the stream's (module doc, "The slow sag")."""
        if self._cap is None:
            return 1.0
        f_ref, r, r_dec = self._cap
        slow = max(0.0, busy_share - f_ref) / (1.0 - f_ref)
        if self.cap_onset is not None and fast_share is not None:
            phi, fr = self.cap_onset["phi"], self.cap_onset["f_ref"]
            slow = phi * max(0.0, fast_share - fr) / (1.0 - fr) + (1.0 - phi) * slow
        x = (r - 1.0) * slow + (r_dec - 1.0) * decode_share
        if compute_share is not None and self._cap_share_ref is not None:
            x *= max(0.0, compute_share) / self._cap_share_ref
        if self.cap_sag is not None and sag_share is not None:
            sg = self.cap_sag
            xs = sg["sag"] * max(0.0, sag_share - sg["f_ref"]) / (sg["w_stream"] - sg["f_ref"])
            if compute_share is not None and sg["share_stream"] > 0:
                xs *= max(0.0, compute_share) / sg["share_stream"]
            x += xs
        return 1.0 + x

    def delay_factor(self, num_decode_seqs: int, num_prefill_tokens: int, num_context_tokens: int,
                     prefill_chunks=None, run_s: float = 0.0, step_s: float = 0.0, after_step: bool = True) -> float:
        """The delayed onset's factor (module doc, "The delayed onset") of a step with prefill that starts
        `run_s` after the run of steps with prefill it belongs to began, and lasts `step_s`: its kind's
        streamed level for the part of it past the delay, the busy level for the part before it where it was
        launched behind another step (`after_step`); 1.0 for a decode-only step, or without the term."""
        cd = self.cap_delay
        if cd is None or num_prefill_tokens <= 0 or step_s <= 0:
            return 1.0
        frac = min(1.0, max(0.0, (run_s + step_s - cd["delay_s"]) / step_s))
        before = cd["busy_level"] if after_step else 1.0
        if frac <= 0:
            return before
        share = self.compute_share(num_decode_seqs, num_prefill_tokens, num_context_tokens, prefill_chunks)
        after = 1.0 + (cd["r_stream"] - 1.0) * share / cd["compute_share_stream"]
        return (1.0 - frac) * before + frac * after

    @property
    def caps_by_compute(self) -> bool:
        """The power cap slows every step, decode-only ones too, by its compute share
        (`compute_share`) against the pause check's step's."""
        return self._cap_share_ref is not None

    @property
    def power_cap_f_ref(self) -> float | None:
        """The prefill-busy share of the window before the profile's (paused) points."""
        return None if self._cap is None else self._cap[0]

    def compute_share(self, num_decode_seqs: int, num_prefill_tokens: int, num_context_tokens: int,
                      prefill_chunks=None) -> float:
        """The share of a step's time past the fit's constant (the weights' read, paid by every
        step whatever it holds): 1 - T_const / T(d, p, ctx). The power cap lowers the SM clock
        and leaves the memory clock (3,201 MHz in every nvidia-smi sample of the H200 runs), so
        what slows is the rest of the step (the module doc)."""
        t = self.step_time(num_decode_seqs, num_prefill_tokens, num_context_tokens, prefill_chunks)
        if t <= 0:
            return 0.0
        return max(0.0, 1.0 - self._const_s / t)

    def launch_time(self, num_decode_seqs: int, num_prefill_tokens: int) -> float:
        """Seconds of the host's launch of such a step (0 where the profile did not measure it)."""
        if self._launch_coef is None:
            return 0.0
        a, b, c = self._launch_coef
        return float(a + b * num_decode_seqs + c * num_prefill_tokens)

    def decode_times(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> np.ndarray:
        return decode_times_by_steps(self, num_decode_seqs, num_context_tokens, k)

    def num_kv_blocks(self, block_size: int) -> int:
        if self._blocks is None:
            raise ValueError("the profile has no num_kv_blocks; give --num-blocks")
        if self._block_size and self._block_size != block_size:
            return int(self._blocks * self._block_size // block_size)
        return int(self._blocks)

    def describe(self) -> dict:
        return {"kind": "profile", "num_points": len(self.points), "r2_linear": round(self.r2, 4),
                "coef": dict(zip(_FEATURE_NAMES[:5] + (_FEATURE_NAMES[5:6] if self._cols[0] else ())
                                 + (_FEATURE_NAMES[6:7] if self._cols[1] else ())
                                 + (_FEATURE_NAMES[7:8] if self._cols[2] else ())
                                 + (_FEATURE_NAMES[8:9] if self._cols[3] is not None else ())
                                 + (_FEATURE_NAMES[9:] if self._cols[4] else ()),
                                 map(float, self.coef))),
                "compute_knee_tokens": self._cols[3],
                "packed_prefill_points": int((self.num_prefill_seqs > 1).sum()),
                "prefix_prefill_points": int((self.prefill_context_len > 0).sum()),
                "prefix_term": ({"from": "twins", **self.prefix_twins} if self.prefix_twins is not None
                                else "fit" if self._cols[1] else None),
                "verify_points": int((self.num_draft_tokens > 0).sum()),
                "budget_packed_points": self.num_budget_points,
                "token_buckets": [] if self.token_buckets is None else [int(b) for b in self.token_buckets],
                "hides_launch": self.hides_launch,
                "fits_device_time": self.fits_device_time,
                "decode_bucket_interpolation": self.interpolates_by_decode_bucket,
                "power_cap": None if self._cap is None else {"f_ref": self._cap[0], "back_to_back": self._cap[1],
                                                              "after_decode": self._cap[2],
                                                              "window_s": self.power_cap_window_s,
                                                              "tau_s": self.power_cap_tau_s,
                                                              "compute_share_ref": self._cap_share_ref,
                                                              "by_power": self.cap_mixed,
                                                              **({"by_power_packed": self.cap_packed}
                                                                 if self.cap_packed else {}),
                                                              **({"onset": self.cap_onset}
                                                                 if self.cap_onset else {}),
                                                              **({"sag": self.cap_sag}
                                                                 if self.cap_sag else {}),
                                                              **({"anchors_device_time": self.cap_anchors}
                                                                 if self.cap_anchors else {})},
                **({"cap_delay": self.cap_delay} if self.cap_delay else {}),
                # named only where the term is set or measured (module doc, "Unequal contexts")
                **({"decode_spread": {"kappa": self.spread_kappa, "points": self.spread_point_kappas,
                                      "plan_from_profile": bool(self.meta.get("decode_attention"))}}
                   if self.spread_kappa is not None else {}),
                **({"mixed_spread": {"points": self.mixed_point_kappas}} if self.mixed_point_kappas else {}),
                **({"tile_edges": {"fractions": self.tile_fractions, "points": self.tile_edge_points}}
                   if self.tile_edge_points else {}),
                **({"mixed_tiles": {"mode": self.mixed_tiles_mode, "fraction": self.mixed_tiles}}
                   if self.mixed_tiles_mode != "off" else {}),
                **({"decode_tiles": {"mode": self.decode_tiles_mode, "fraction": self.decode_tiles}}
                   if self.decode_tiles_mode != "off" else {}),
                **{k: v for k, v in self.meta.items() if isinstance(v, (str, int, float))}}
