"""No file lf reads runs code: a malicious pickle planted in every place a pickle could be read is refused by name.

The places (the inventory; the libraries' own tests go deeper: ``lf-parallel/tests/test_checkpoint_safe_load.py``,
``lf-data/tests/test_rlbench.py``):

- a checkpoint's DCP ``.metadata`` (``lf run --resume``, ``lf eval``, ``lf sample``: allow-listed unpickler);
- a non-tensor (byte) item inside a DCP shard ``__0_0.distcp`` (``--resume``: ``weights_only=True``);
- ``train_state.pt`` of a checkpoint and ``state.pt`` of the legacy layout (``weights_only=True``);
- ``.npy`` inputs of ``lf tokenize encode|decode`` (``allow_pickle=False``);
- RLBench's ``low_dim_obs.pkl`` and ``variation_descriptions.pkl`` (allow-listed unpickler);
- files that must not be pickles at all, with a pickle in their place: ``model.safetensors`` of ``lf convert
  export-hf``, a peer folder offering only ``pytorch_model.bin`` to ``lf convert import-hf``, the action
  tokenizer JSON.

Oracle: a marker file that the planted pickle's ``__reduce__`` (``os.system("touch <marker>")``) creates when it
is unpickled the ordinary way (checked with plain ``pickle.loads`` first, so the payload is known to work); after
each command the marker must not exist, the command must fail with exit code 2 and an ``error:`` line (no
traceback) naming the file and, where a pickle was parsed, ``posix.system``.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import load_config, to_toml

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SYSTEM = "posix.system" if os.name == "posix" else "nt.system"
TAMPERED = "this checkpoint was not written by lf or was tampered with"


class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _payload(marker: Path, protocol: int = 4) -> bytes:
    """A pickle that runs ``touch marker`` when loaded the ordinary way (proven on a scratch marker)."""
    probe = marker.with_name(marker.name + ".probe")
    pickle.loads(pickle.dumps(_Evil(probe), protocol=protocol))
    assert probe.exists(), "the planted payload must run under plain pickle"
    probe.unlink()
    return pickle.dumps(_Evil(marker), protocol=protocol)


def _torch_payload(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(_Evil(marker), buf)
    return buf.getvalue()


def _invoke(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
        f"a traceback instead of an error message: {result.exception!r}\n{result.output}"
    return result.exit_code, " ".join(result.output.split())


def _copy(run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the run folder and its checkpoint folder."""
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    return copy, copy / "checkpoints" / "step-00000002"


def _refused(code: int, out: str, file: Path, name: str | None = SYSTEM, marker: Path | None = None) -> None:
    """The command ran nothing (``marker`` absent) and failed naming ``file`` (and the class ``name``)."""
    assert marker is None or not marker.exists(), f"the planted pickle ran: {marker} exists"
    assert code == 2, out
    assert f"error: {file}" in out, out
    if name is not None:
        assert f"refused to unpickle {name}" in out, out
    assert "Traceback" not in out and "weights_only" not in out, out


def test_resume_eval_and_sample_refuse_a_malicious_dcp_metadata(vla_run, tmp_path):
    """`lf run --resume`, `lf eval` and `lf sample` all read the checkpoint's .metadata first."""
    run, ckpt = _copy(vla_run, tmp_path)
    marker = tmp_path / "pwned"
    (ckpt / ".metadata").write_bytes(_payload(marker))
    _refused(*_invoke("run", "--resume", run), ckpt / ".metadata", marker=marker)
    assert TAMPERED in _invoke("run", "--resume", run)[1]
    _refused(*_invoke("eval", run, "--episodes", "1", "--no-random"), ckpt / ".metadata", marker=marker)
    video = tmp_path / "video"  # a video run folder holding the same (planted) checkpoint
    video.mkdir()
    (video / "config.toml").write_text(to_toml(load_config(EXAMPLES / "wan_t2v.toml")))
    shutil.copytree(run / "checkpoints", video / "checkpoints")
    from lf_data import METAWORLD_INSTRUCTIONS, build_instruction_tokenizer
    from lf_orchestrator.families._video_data import save_text_encoder

    tok = build_instruction_tokenizer([METAWORLD_INSTRUCTIONS["reach-v3"]])
    save_text_encoder(video, tok, torch.zeros(tok.get_vocab_size(), 4))
    _refused(*_invoke("sample", video, "--prompt", METAWORLD_INSTRUCTIONS["reach-v3"], "--steps", "1",
                      "--out", tmp_path / "clip.mp4"), video / "checkpoints" / "step-00000002" / ".metadata",
             marker=marker)
    assert not marker.exists()


def test_resume_refuses_a_malicious_byte_item_in_a_dcp_shard(vla_run, tmp_path):
    """The optimizer's hyper-parameters are non-tensor DCP items; one of them now unpickles os.system."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    run, ckpt = _copy(vla_run, tmp_path)
    marker = tmp_path / "pwned"
    meta = pickle.loads((ckpt / ".metadata").read_bytes())  # written by this test's own `lf run`
    key = next(k for k, v in meta.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata))
    index = next(i for i in meta.storage_data if i.fqn == key)
    info = meta.storage_data[index]
    data = _torch_payload(marker)
    shard = ckpt / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(data)
    meta.storage_data[index] = _StorageInfo(info.relative_path, offset, len(data), info.transform_descriptors)
    meta.storage_meta = None
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    code, out = _invoke("run", "--resume", run)
    _refused(code, out, shard, marker=marker)
    assert f"(item '{key}')" in out
    assert not marker.exists()


def test_resume_refuses_a_malicious_train_state(vla_run, tmp_path):
    run, ckpt = _copy(vla_run, tmp_path)
    marker = tmp_path / "pwned"
    (ckpt / "train_state.pt").write_bytes(_torch_payload(marker))
    _refused(*_invoke("run", "--resume", run), ckpt / "train_state.pt", marker=marker)
    (ckpt / "train_state.pt").write_bytes(_payload(marker))  # a bare pickle, not a torch.save archive
    _refused(*_invoke("run", "--resume", run), ckpt / "train_state.pt", marker=marker)
    assert not marker.exists()


def test_legacy_state_file_is_refused_by_name(tmp_path):
    """The legacy full-state layout's state.pt (``lf eval`` and the trainer's resume read it)."""
    from safetensors.torch import save_file

    from lf_orchestrator.checkpoint import load_checkpoint
    from lf_parallel import UnsafeCheckpointError

    marker = tmp_path / "pwned"
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "state.pt").write_bytes(_torch_payload(marker))
    with pytest.raises(UnsafeCheckpointError, match=rf"state\.pt: refused to unpickle {SYSTEM}"):
        load_checkpoint(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["object array", "bare pickle"])
def test_tokenize_refuses_pickled_npy_inputs(tmp_path, kind):
    """`lf tokenize encode` / `decode` read .npy files with allow_pickle=False."""
    from lf_tokenize_action import BinningTokenizer

    tok = tmp_path / "tok.json"
    BinningTokenizer.fit({"min": [-1.0, -1.0], "max": [1.0, 1.0], "mean": [0.0, 0.0], "std": [1.0, 1.0],
                          "q01": [-1.0, -1.0], "q99": [1.0, 1.0]}, n_bins=8).save(tok)
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.npy"
    if kind == "object array":
        np.save(evil, np.array([_Evil(marker)], dtype=object), allow_pickle=True)
    else:
        evil.write_bytes(_payload(marker))
    for command in ("encode", "decode"):
        code, out = _invoke("tokenize", command, tok, evil, tmp_path / "out.npy")
        _refused(code, out, evil, marker=marker)
    assert not marker.exists()


def test_rlbench_pickles_are_refused_by_name(tmp_path):
    """RLBench's pickles are the one dataset format that is a pickle: both are read by the allow-listed unpickler."""
    from lf_data import DataError
    from lf_data.rlbench import safe_load

    marker = tmp_path / "pwned"
    for name in ("low_dim_obs.pkl", "variation_descriptions.pkl"):
        for protocol in (0, 2, 4):
            (tmp_path / name).write_bytes(_payload(marker, protocol))
            with pytest.raises(DataError, match=rf"{name}: pickle refers to {SYSTEM}, which is not allowed"):
                safe_load(tmp_path / name)
    assert not marker.exists()


def test_convert_and_tokenizer_never_unpickle_a_pickle_in_place_of_their_files(tmp_path):
    """Files that are never pickles: a pickle in their place is refused as the wrong format, naming the file."""
    marker = tmp_path / "pwned"
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.json").write_text('{"recipe": "llama3", "config": {}}')
    (model / "model.safetensors").write_bytes(_torch_payload(marker))
    code, out = _invoke("convert", "export-hf", model, tmp_path / "hf")
    _refused(code, out, model / "model.safetensors", name=None)
    assert "not a safetensors file" in out
    peer = tmp_path / "peer"
    peer.mkdir()
    (peer / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    (peer / "pytorch_model.bin").write_bytes(_torch_payload(marker))
    code, out = _invoke("convert", "import-hf", peer, tmp_path / "lf")
    assert code == 2 and f"error: {peer}" in out and "Traceback" not in out, out
    tok = tmp_path / "tok.json"
    tok.write_bytes(_payload(marker))
    np.save(tmp_path / "a.npy", np.zeros((2, 2)))
    code, out = _invoke("tokenize", "encode", tok, tmp_path / "a.npy", tmp_path / "out.npy")
    assert code == 2 and f"error: {tok}: not a tokenizer JSON" in out, out
    assert not marker.exists()
