"""DCP checkpoints: atomic folders and the completion marker (one process, no process group).

Oracle: the state written (model weights and AdamW moments) read back bit for bit; a folder without the
marker is refused. Resharding across plans is tested in ``test_hybrid_world4``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lf_parallel._checkpoint import MARKER, is_complete, latest_checkpoint, load_checkpoint, save_checkpoint


def _trained(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def test_save_then_load_restores_model_and_optimizer(tmp_path):
    model, opt = _trained(0)
    dst = save_checkpoint(tmp_path / "step-000001", model, opt, extra={"step": 1})
    assert is_complete(dst) and not (tmp_path / "step-000001.tmp").exists()
    fresh, fresh_opt = _trained(1)
    assert load_checkpoint(dst, fresh, fresh_opt) == {"step": 1}
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    for pa, pb in zip(model.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(fresh_opt.state[pb]["exp_avg"], opt.state[pa]["exp_avg"], rtol=0, atol=0)


def test_incomplete_folder_is_never_loaded(tmp_path):
    model, opt = _trained(0)
    dst = save_checkpoint(tmp_path / "a", model, opt)
    (dst / MARKER).unlink()  # as if the job died before the marker was written
    with pytest.raises(FileNotFoundError, match=r"a is missing or incomplete \(no .lf_complete marker\)"):
        load_checkpoint(dst, model, opt)
    assert latest_checkpoint(tmp_path) is None
    good = save_checkpoint(tmp_path / "b", model, opt)
    assert latest_checkpoint(tmp_path) == good


def test_existing_folder_is_not_overwritten_and_stale_tmp_is_replaced(tmp_path):
    model, opt = _trained(0)
    (tmp_path / "c.tmp").mkdir()
    (tmp_path / "c.tmp" / "junk").write_text("half-written")
    dst = save_checkpoint(tmp_path / "c", model, opt)
    assert not (dst / "junk").exists()
    with pytest.raises(FileExistsError, match="already exists"):
        save_checkpoint(dst, model, opt)


@pytest.mark.parametrize("remove", [".metadata", "shard"])
def test_damaged_folder_is_named_before_dcp_reads_it(tmp_path, remove):
    """Oracle: a complete-marked checkpoint whose DCP index or a shard was deleted gives one named error."""
    from lf_parallel._checkpoint import read_full_tensors

    model, opt = _trained(0)
    dst = save_checkpoint(tmp_path / "d", model, opt)
    victim = dst / ".metadata" if remove == ".metadata" else next(dst.glob("*.distcp"))
    victim.unlink()
    want = r"d is damaged: its DCP index .* is missing" if remove == ".metadata" else r"shard file\(s\) \['__0_0"
    with pytest.raises(FileNotFoundError, match=want):
        load_checkpoint(dst, model, opt)
    with pytest.raises(FileNotFoundError, match=want):
        read_full_tensors(dst)
