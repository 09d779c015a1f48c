"""Statistical efficiency: how many more samples a larger global batch needs to reach a
target accuracy, with intervals, models that predict it at batches not run, and the
time-to-accuracy forecast that follows from them. One module a topic:

    crossings     where one seed's accuracy curve first reaches the target, MLPerf's
                  way and interpolated between the evaluations that bracket it
    over_seeds    a ratio of two points' per-seed values (statistical efficiency, a
                  time-to-accuracy speed-up) with an interval over seeded launches
    noise         the gradient noise scale of McCandlish, Kaplan, Amodei et al. 2018
                  ("An Empirical Model of Large-Batch Training", appendix A) over a
                  window of steps, per evaluation interval and progress-weighted
    batch_model   E(B) = E_min (1 + B / B_crit), fitted over seeds, its prediction,
                  its out-of-sample check and B_crit beside the noise scale
    power_law     E(B) = c B^alpha, the second model, fitted over the same seeds
    model_choice  the two models weighed by leave-one-batch-out predictive scores
                  (pseudo-BMA+), their mixture's holdout and draws, and misfit_band:
                  where the between-batch misfit widens a band
    forecast      time to accuracy(k) = predicted samples to target at B = k x b over
                  samples/s(k), with a joint band over the models, their fits and
                  samples/s; the fastest k (with its probability over the models) and
                  the k that costs fewest GPU-hours

Pure (numpy and scipy, loaded on first use; no torch). Every interval says what it
covers (`covers`): common.SEEDS for anything over seeds, the blocks of steps of one run
for the noise scale. Nothing is imported here: a measurement that needs one topic
(dpscale.measure.torch_tta: crossings and noise) carries only that one in its digest.
"""
