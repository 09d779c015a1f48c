"""The stand-in machines, apart from running one job: two "nodes" of one machine (two
network namespaces joined by a rate-limited veth), a measurement run across them, the
stand-in's jobs and kept layout, and rounds of one protocol pooled into one result."""
