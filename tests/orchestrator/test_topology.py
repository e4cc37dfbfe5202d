import pytest

from orchestrator.plan.topology import rank_layout


def test_issue_example_eight_gpus_tp2_pp2_dp2_with_tp_pp_dp_mapping():
    layout = rank_layout(tp=2, cp=1, dp=2, pp=2, order="tp-cp-ep-pp-dp")
    assert layout.tp == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.pp == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.dp == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_megatron_default_order_puts_data_parallel_inside_pipeline():
    layout = rank_layout(tp=2, cp=1, dp=2, pp=2)
    assert layout.tp == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.dp == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.pp == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("tp, cp, dp, pp", [(2, 1, 2, 2), (4, 1, 4, 2), (2, 2, 2, 2), (1, 1, 8, 1), (8, 2, 1, 3)])
@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"])
def test_groups_equal_megatron_rank_generator(tp, cp, dp, pp, order):
    from megatron.core.parallel_state import RankGenerator

    ours = rank_layout(tp=tp, cp=cp, dp=dp, pp=pp, order=order)
    theirs = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    for kind in ("tp", "cp", "dp", "pp"):
        assert getattr(ours, kind) == sorted(theirs.get_ranks(kind)), kind
