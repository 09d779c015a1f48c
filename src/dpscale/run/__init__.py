"""Running one job safely: the watchdog, the worker's command, the devices' locks,
lifelines, NCCL's flight recorder, the job's logs, and merging independent launches."""
