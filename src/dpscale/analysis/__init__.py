"""Pure functions over numbers: statistics (scipy), the cost and roofline models, the
forecast model, time-to-accuracy scoring. No experiment names: the report feeds them."""
