import os
import sys

from .cli import main

status = main()
if "torch.distributed" in sys.modules and "RANK" in os.environ:
    # Under torchrun (schedopt calibrate): leave without C++ static destructors, in which torch
    # 2.13's gloo aborts now and then ("terminate called without an active exception") after the
    # command has finished and written its output.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
raise SystemExit(status)
