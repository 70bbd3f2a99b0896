"""The orchestration side of the adaptive batch: the runtime controller that picks each step's
batch and lr (`controller`, on the clocks' floor: it reads their noise estimates), the
trajectory a run's batches took (`trajectory`), the sim backend's runner of the controller's
branches (`sim_branch`, on the controller's floor, below the backends that hand it over), and
the probe that plans short branches from a parent checkpoint to measure the batch (`probe`, on
the planners' floor: it asks the backends).
The package holds rooms on different floors; this file imports nothing."""
