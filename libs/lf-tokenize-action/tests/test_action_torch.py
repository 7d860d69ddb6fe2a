"""torch tensor inputs: converted through numpy, returned as tensors on the input's device.

Oracle: the numpy path on the same values.
"""

import subprocess
import sys

import numpy as np
import pytest

from lf_tokenize_action import ActionVocab, BinningTokenizer

torch = pytest.importorskip("torch")


def test_import_does_not_import_torch():
    """`import lf_tokenize_action` leaves torch out of sys.modules (checked in a fresh interpreter)."""
    code = "import sys, lf_tokenize_action; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_encode_decode_tensors(dtype):
    """encode(tensor) -> int64 tensor equal to the numpy bins; decode(tensor) -> float32 tensor."""
    tok = BinningTokenizer([-1.0, 0.0], [1.0, 10.0], n_bins=32)
    x = torch.tensor([[0.5, 3.0], [-2.0, 9.5]], dtype=dtype)
    bins, clipped = tok.encode(x, return_clipped=True)
    assert isinstance(bins, torch.Tensor) and bins.dtype == torch.int64 and bins.device == x.device
    expected = tok.encode(x.double().numpy())
    np.testing.assert_array_equal(bins.numpy(), expected)
    assert clipped.dtype == torch.bool and clipped.tolist() == [[False, False], [True, False]]
    out = tok.decode(bins)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), tok.decode(expected).astype(np.float32))


def test_torch_nan_and_range_errors():
    """Errors are the same as on the numpy path."""
    tok = BinningTokenizer([0.0], [1.0], n_bins=4)
    with pytest.raises(ValueError, match=r"index \(1, 0\)"):
        tok.encode(torch.tensor([[0.0], [float("nan")]]))
    with pytest.raises(ValueError, match="first is 4"):
        tok.decode(torch.tensor([[4]]))


def test_vocab_tensors():
    """ActionVocab maps int tensors to int64 tensors and back; is_action_token gives a bool tensor."""
    v = ActionVocab(100, 8)
    bins = torch.tensor([[0, 7], [3, 4]], dtype=torch.int32)
    ids = v.to_token_ids(bins)
    assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int64
    assert ids.tolist() == [[100, 107], [103, 104]]
    back = v.to_bins(ids)
    assert isinstance(back, torch.Tensor) and back.tolist() == [[0, 7], [3, 4]]
    mask = v.is_action_token(torch.tensor([99, 100, 108]))
    assert mask.dtype == torch.bool and mask.tolist() == [False, True, False]
    with pytest.raises(ValueError, match="first is 99"):
        v.to_bins(torch.tensor([99]))
