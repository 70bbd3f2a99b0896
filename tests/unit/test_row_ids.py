"""`decoder_math.row_ids` (the decode loop's and the Scorer's distinct histories) against the
truth it replaces: the inverse of torch.unique over rows (dim=0), id for id."""

from __future__ import annotations

import pytest
import torch

from trainer.decoder_math import row_ids


def _truth(*columns):
    return torch.unique(torch.stack(columns, 1), dim=0, return_inverse=True)[1]


@pytest.mark.parametrize("seed", range(5))
def test_ids_are_unique_over_rows_inverse(seed):
    """Parents, tokens and a mask bit as the Scorer's prefix nodes have them, with repeats and
    negative values (each column's shift), in both orders of columns."""
    g = torch.Generator().manual_seed(seed)
    n = 64
    cols = [torch.randint(0, 12, (n,), generator=g), torch.randint(-3, 49152, (n,), generator=g)]
    cols[1][::3] = cols[1][0]  # rows sharing a token
    mask = torch.randint(0, 2, (n,), generator=g)
    for c in (cols, cols[::-1], [*cols, mask], [mask.bool(), cols[0]]):
        assert torch.equal(row_ids(*c), _truth(*c))


def test_one_row_no_rows_and_spans_beyond_an_int64():
    one = torch.tensor([7])
    assert row_ids(one, one).tolist() == [0]
    empty = torch.zeros(0, dtype=torch.long)
    assert row_ids(empty, empty).shape == (0,)
    # spans of 2**40 and 2**30: their product does not fit, the rows are compared as rows
    wide = torch.tensor([0, 2**40, 5, 2**40, 0])
    tall = torch.tensor([2**30, 1, 2**30, 1, 0])
    assert torch.equal(row_ids(wide, tall), _truth(wide, tall))
    assert row_ids(wide, tall).tolist() == [1, 3, 2, 3, 0]
    bits = torch.tensor([True, False, True, True, False])  # a bool column beside them
    assert torch.equal(row_ids(wide, bits), _truth(wide, bits.long()))
