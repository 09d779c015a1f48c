"""Code no pipeline variant runs: probes of the tuned step and options that were
measured and left off. Outside every measurement's digest."""
