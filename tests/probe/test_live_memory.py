"""The probe's measurement (orchestrator/probe/live_memory.py, host_tensors.py) on fake
tensors: storages counted once, by the phase that made them, freed when the last view
goes, the peak and its composition kept; host tensors stay real."""

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from orchestrator.probe.host_tensors import RealOnRealInputs
from orchestrator.probe.live_memory import LiveMemory

MIB = 2**20


def test_storages_are_counted_by_phase_freed_with_their_last_view_and_the_peak_is_kept():
    memory = LiveMemory()
    with FakeTensorMode(), memory:
        weight = torch.nn.Parameter(torch.empty(MIB // 4))  # 1 MiB fp32
        grad_buffer = torch.zeros(2 * MIB // 4)
        master = torch.empty(3 * MIB // 4)
        memory.sort_setup([weight], [grad_buffer])
        assert memory.snapshot()["now_by_category"] == {"weights": MIB, "grads": 2 * MIB, "optimizer": 3 * MIB,
                                                        "activations": 0, "temporaries": 0}
        memory.phase = "forward"
        saved = torch.empty(4 * MIB // 4)
        view = saved[: MIB // 4]  # a view: no new storage
        transient = torch.empty(8 * MIB // 4)
        del transient  # freed: the peak keeps it, "now" does not
        memory.phase = "backward"
        grad_of_saved = torch.empty(MIB // 4)
        del saved  # the view keeps the storage alive
        snapshot = memory.snapshot()
        assert snapshot["now_by_category"]["activations"] == 4 * MIB
        del view
        assert memory.snapshot()["now_by_category"]["activations"] == 0
        assert memory.snapshot()["now_by_category"]["temporaries"] == MIB
        del grad_of_saved
    assert snapshot["peak"] == (1 + 2 + 3 + 4 + 8) * MIB
    assert snapshot["peak_by_category"] == {"weights": MIB, "grads": 2 * MIB, "optimizer": 3 * MIB,
                                            "activations": 12 * MIB, "temporaries": 0}


def test_host_tensors_stay_real_and_device_work_stays_fake():
    memory = LiveMemory()
    host = torch.arange(6)
    with FakeTensorMode(allow_non_fake_inputs=True), memory, RealOnRealInputs(memory):
        counts = (host == 3).sum()  # real inputs only: computed for real, its value can be read
        draw = torch.randint(0, 10, (3,), generator=torch.Generator().manual_seed(0))  # a host draw
        model_side = torch.empty(4) + host[:4]  # a factory is fake, and so is what touches it
        assert int(counts) == 1 and not isinstance(counts, FakeTensor)
        assert not isinstance(draw, FakeTensor) and draw.tolist() == torch.randint(
            0, 10, (3,), generator=torch.Generator().manual_seed(0)).tolist()
        assert isinstance(model_side, FakeTensor)
