"""What the workflow asks for: the config and its checks, the machine's fingerprint,
the specs of jobs, the files and resources of each rule (jobs), the nodes a k spans."""
