"""The trainer's side of the adaptive batch: its options (`config`), a training started from
another's checkpoint (`branch`), the in-run branches of a branch-rule decision (`inrun`) and the
in-memory copy of a run's state they start from (`snapshot`). The loop enters through
`inrun.adapt` and `inrun.adopt`, handing its own steps as an `inrun.LoopSteps` port."""
