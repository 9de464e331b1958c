"""Training runs: the `Trainer`, SFT (and RL) jobs, metrics and the run directory."""
