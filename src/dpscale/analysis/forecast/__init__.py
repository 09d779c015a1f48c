"""The forecast: a model of one data-parallel step at k devices (model), fed by what a
machine measured, in the forecast's own terms (inputs), built under a rule that says what
it may use, with the inputs it used (fit), predicting efficiency, step time and overhead
with a band over a grid of k and nodes (predict), checked out of sample against every
measured k beside naive predictors (check); fabric tiers measured elsewhere come from
nccl-tests' output (fabric_file). Names no experiment: dpscale.report.forecast feeds it.
"""
