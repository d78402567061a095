"""The distributed oracle: a plan run as a real multi-process ``torch.distributed`` training
step (gloo), compared with the single-device torch step (docs/oracle.md)."""

from trainverify_dsl.oracle.rank import OracleError
from trainverify_dsl.oracle.run import (
    MAX_RANKS,
    Difference,
    OracleResult,
    run_distributed,
    run_many,
)

__all__ = ["MAX_RANKS", "Difference", "OracleError", "OracleResult", "run_distributed",
           "run_many"]
