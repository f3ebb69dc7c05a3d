import torch

from slimeish.engine.decode_view import DecodeView


def _view() -> DecodeView:
    return DecodeView(2, (2, 8), (2, 8), torch.float32, torch.device("cpu"), 4, 1 << 20)


def test_a_step_of_the_same_batch_writes_where_a_fresh_arrangement_would():
    pool = [torch.randn(2, 64, 8) for _ in range(2)]
    ids, pages = [7, 3, 5], [[0, 1], [2, 3, 4], [5]]
    steady, fresh = _view(), _view()
    assert steady.arrange(ids, [5, 9, 2], pages, pool, pool) is not None
    rows = steady.arrange(ids, [6, 10, 3], pages, pool, pool)  # one token further: nothing rebuilt
    assert rows == fresh.arrange(ids, [6, 10, 3], pages, pool, pool)
    assert steady.write.keys() == fresh.write.keys()
    for heads in steady.write:
        assert torch.equal(steady.write[heads], fresh.write[heads])
    # a position that does not follow on (the sequence was not stepped) takes the full path
    assert steady.arrange(ids, [7, 11, 3], pages, pool, pool) == rows
    assert steady.lengths == {7: 8, 3: 12, 5: 4}
