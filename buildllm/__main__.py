# `python -m buildllm` and `torchrun -m buildllm` enter here.
from buildllm.cli import main

raise SystemExit(main())
