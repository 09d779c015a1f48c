"""The measurements a worker runs (one module per family of experiments), its
per-rank context, and the instruments it times with (timing, gpustate). Imports
nothing of plan/, run/ or lab/: what it runs is its digest."""
