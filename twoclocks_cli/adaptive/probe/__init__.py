"""`twoclocks probe`: the *local* critical batch size at one point of a run, from short branches.
A room of the adaptive package on the planners' floor: it plans cells and asks the backends.

Merrill et al. (2025) measure the critical batch directly: from a checkpoint, short runs at
several batch sizes (lr by the sweep's scaling rule, same seeds), and the batch at which the
samples needed for a fixed gain double over the small-batch limit. In our units: from the run's
state at `at` samples every batch branches `seeds` times for up to `branch_samples` samples;
the gain target is a share of the median gain the best batch makes in that budget; each
branch's clock is the samples it needs to reach it; B_crit solves E(B_crit) = 2 E_min with the
model-free estimator `analyze` uses (`clocks.critical.empirical`).

`sim` runs branch the theory model in this process (`probe.sim`); `grpo` runs branch real
training as cells of a small sweep (`probe.grpo`, submitted by `launch.probe`).
"""
