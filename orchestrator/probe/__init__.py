"""The full-size probe: one training step of a plan's model at its real shapes and
layout, on fake tensors in one CPU process per pipeline stage, its memory measured
category by category (`audiollm plan ... --probe`; orchestrator/plan/probe_report.py runs
it and sets it beside the plan's estimate).

Job side: imports torch and megatron. The modules:
  fake_world.py   a fake process group of the plan's world size at one rank, and
                  megatron's parallel state on it
  live_memory.py  every live tensor storage, by category, and the peak
  stand_ins.py    what cannot run on fake tensors, replaced by a stand-in with the same
                  saved-tensor profile (named in the output)
  role.py         one rank role: the job's Trainer on the plan, micro-batches of the
                  plan's shapes, the optimizer's state made, one step measured, as JSON
"""

from orchestrator.runtime.megatron_import import import_megatron

import_megatron()  # first, before any module here imports megatron (see there why)

