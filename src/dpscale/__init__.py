"""dpscale: the library behind the multi-GPU data-parallel scaling pipeline.

One folder a floor; imports only run down (tests/test_structure.py):

    registry, results, provenance   the ground: what every experiment is, the results
                                    contract, the code a number came from
    data/      Fashion-MNIST: fetch and resize (the data stage), load (what a worker reads)
    model/     the ResNet-18 in torch and flax, and the tuned step's transformations
    analysis/  statistics, cost model, roofline, forecast, time-to-accuracy scoring:
               pure functions that name no experiment
    plan/      config, fingerprint, specs and jobs: what the workflow asks for
    measure/   the workers' measurements and the instruments they time with
    run/       running one job safely: watchdog, command, devices, lifelines, launches
    report/    chapters, figures, the tidy table, the forecast of each machine
    lab/       code no pipeline variant runs (probes, options measured and left off)
    cli        the `dpscale` command

A measurement's digest (dpscale.provenance) holds the modules its worker imports:
ground, data.load, model, analysis and measure, never plan, run or lab. Light to import
except the measurements, the models and the lab, which import torch or jax.
"""

__version__ = "0.1.0"
