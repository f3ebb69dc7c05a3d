"""`slimeish train` and its Python API: `run(TrainSetup(...))` runs a whole training run.

- `setup`: the typed configs (`TrainSetup`, `RunConfig`), the flags for them, the plugins' `args`;
- `loop`: the loop itself (generate → train → sync → save), `run` and `main`;
- `parts`: the trainer, weight sync, buffer client and producer the loop drives;
- `collect`: trainable groups out of the buffer, and evaluations;
- `producer`: runs the rollout function and lands its groups in the buffer;
- `launch`: starts (or connects to) the buffer, engines and router;
- `checkpoint`, `ledger`, `metrics`: what a run records.
"""

from slimeish.train.loop import main, run
from slimeish.train.setup import RunConfig, TrainSetup, parse_args

__all__ = ["RunConfig", "TrainSetup", "main", "parse_args", "run"]
