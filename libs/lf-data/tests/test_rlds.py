"""RLDSDataset on TFDS folders written with the `tfrecord` package in Open X-Embodiment layouts.

The writer below stores episodes the way TFDS does for RLDS (one tf.train.Example per episode,
keys flattened with "/", step values stacked then flattened) with features.json /
dataset_info.json as TFDS writes them for bridge (tensor action, steps/language_instruction)
and fractal20220817_data (dict action, observation/natural_language_instruction).
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from lf_data import DataError, RLDSDataset

pytest.importorskip("tfrecord")

FD = "tensorflow_datasets.core.features."


def _tensor(shape, dtype="float32"):
    return {"pythonClassName": FD + ("scalar.Scalar" if not shape else "tensor_feature.Tensor"),
            "tensor": {"shape": {"dimensions": [str(s) for s in shape]} if shape else {}, "dtype": dtype,
                       "encoding": "none"}}


def _image(shape, fmt):
    return {"pythonClassName": FD + "image_feature.Image",
            "image": {"shape": {"dimensions": [str(s) for s in shape]}, "dtype": "uint8", "encodingFormat": fmt}}


def _text():
    return {"pythonClassName": FD + "text_feature.Text", "text": {}}


def _dict(features):
    return {"pythonClassName": FD + "features_dict.FeaturesDict", "featuresDict": {"features": features}}


def _features(steps):
    return _dict({"steps": {"pythonClassName": FD + "dataset_feature.Dataset",
                            "sequence": {"feature": _dict(steps), "length": "-1"}},
                  "episode_metadata": _dict({"file_path": _text()})})


BRIDGE_STEPS = {
    "action": _tensor([7]), "discount": _tensor([]), "reward": _tensor([]),
    "is_first": _tensor([], "bool"), "is_last": _tensor([], "bool"), "is_terminal": _tensor([], "bool"),
    "language_instruction": _text(),
    "observation": _dict({"image_0": _image([6, 5, 3], "jpeg"), "state": _tensor([7])}),
}
FRACTAL_STEPS = {
    "action": _dict({"base_displacement_vector": _tensor([2]), "base_displacement_vertical_rotation": _tensor([1]),
                     "gripper_closedness_action": _tensor([1]), "rotation_delta": _tensor([3]),
                     "terminate_episode": _tensor([3], "int32"), "world_vector": _tensor([3])}),
    "is_first": _tensor([], "bool"), "is_last": _tensor([], "bool"), "is_terminal": _tensor([], "bool"),
    "reward": _tensor([]),
    "observation": _dict({"base_pose_tool_reached": _tensor([7]), "gripper_closed": _tensor([1]),
                          "image": _image([4, 6, 3], "png"), "natural_language_embedding": _tensor([8]),
                          "natural_language_instruction": _text()}),
}


def _encode(img, fmt):
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt)
    return buf.getvalue()


def _episode(specs, steps, rng, instruction, fmt):
    """{flat step key: (T, ...) array or list of T bytes} for the leaves of ``specs``."""
    out = {}

    def walk(node, prefix):
        for key, child in node["featuresDict"]["features"].items():
            k = prefix + key
            if "featuresDict" in child:
                walk(child, k + "/")
            elif "image" in child:
                shape = [int(s) for s in child["image"]["shape"]["dimensions"]]
                out[k] = [_encode(rng.integers(0, 256, shape, dtype=np.uint8), fmt) for _ in range(steps)]
            elif "text" in child:
                out[k] = [instruction.encode()] * steps
            else:
                shape = [int(s) for s in child["tensor"]["shape"].get("dimensions", [])]
                dtype = child["tensor"]["dtype"]
                if dtype == "bool":
                    out[k] = np.arange(steps) == (0 if key == "is_first" else steps - 1)
                elif dtype.startswith("int"):
                    out[k] = rng.integers(-3, 3, (steps, *shape)).astype(dtype)
                else:
                    out[k] = rng.normal(size=(steps, *shape)).astype(np.float32)

    walk(_dict(specs), "")
    return out


def _write(root, name, steps_spec, episodes, shard_sizes):
    """TFDS folder: features.json, dataset_info.json, shards written by tfrecord.writer.TFRecordWriter."""
    from tfrecord.writer import TFRecordWriter

    root.mkdir(parents=True)
    (root / "features.json").write_text(json.dumps(_features(steps_spec)))
    (root / "dataset_info.json").write_text(json.dumps({
        "name": name, "fileFormat": "tfrecord", "version": "0.1.0",
        "splits": [{"name": "train", "numBytes": "0", "shardLengths": [str(n) for n in shard_sizes],
                    "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"}]}))
    it = iter(episodes)
    paths = []
    for s, n in enumerate(shard_sizes):
        path = root / f"{name}-train.tfrecord-{s:05d}-of-{len(shard_sizes):05d}"
        w = TFRecordWriter(str(path))
        for _ in range(n):
            ep = next(it)
            datum = {"episode_metadata/file_path": ([b"/raw/ep.h5"], "byte")}
            for k, v in ep.items():
                if isinstance(v, list):
                    datum[f"steps/{k}"] = (v, "byte")
                elif v.dtype == bool or v.dtype.kind == "i":
                    datum[f"steps/{k}"] = (v.reshape(-1).astype(np.int64).tolist(), "int")
                else:
                    datum[f"steps/{k}"] = (v.reshape(-1), "float")
            w.write(datum)
        w.close()
        paths.append(path)
    return paths


def _bridge(tmp_path, lengths=(3, 5, 2), shards=(2, 1), mutate=None):
    rng = np.random.default_rng(0)
    eps = [_episode(BRIDGE_STEPS, n, rng, f"task {e % 2}", "JPEG") for e, n in enumerate(lengths)]
    if mutate:
        mutate(eps)
    paths = _write(tmp_path / "bridge" / "0.1.0", "bridge", BRIDGE_STEPS, eps, shards)
    return tmp_path / "bridge" / "0.1.0", eps, paths


def test_bridge_tensor_action_layout_reads_back_written_values(tmp_path):
    """Oracle: the arrays written; images = Pillow's decoding of the JPEG bytes written."""
    root, eps, _ = _bridge(tmp_path)
    ds = RLDSDataset(root, action_horizon=3)
    assert len(ds) == 10 and ds.num_episodes == 3 and ds.tasks == ["task 0", "task 1"]
    assert ds.image_key == "observation/image_0" and ds.state_keys == ["observation/state"]
    i = 0
    for e, ep in enumerate(eps):
        steps = len(ep["action"])
        for t in range(steps):
            item = ds[i]
            want = np.asarray(Image.open(io.BytesIO(ep["observation/image_0"][t])).convert("RGB"))
            np.testing.assert_array_equal(item["image"].numpy(), want)
            np.testing.assert_array_equal(item["state"].numpy(), ep["observation/state"][t])
            idx = np.minimum(t + np.arange(3), steps - 1)
            np.testing.assert_array_equal(item["actions"].numpy(), ep["action"][idx])
            assert item["action_is_pad"].tolist() == [t + j >= steps for j in range(3)]
            assert (item["task"], item["task_index"], item["episode_index"], item["frame_index"]) == \
                (f"task {e % 2}", e % 2, e, t)
            i += 1
    all_actions = np.concatenate([ep["action"] for ep in eps]).astype(np.float64)
    np.testing.assert_allclose(ds.stats["action"]["mean"], all_actions.mean(0), rtol=1e-12, atol=1e-15)


def test_fractal_dict_action_layout_and_instruction_in_observation(tmp_path):
    """Oracle: written values; action = world_vector ++ rotation_delta ++ gripper_closedness_action,
    state = base_pose_tool_reached ++ gripper_closed; PNG images equal the written arrays."""
    rng = np.random.default_rng(1)
    eps = [_episode(FRACTAL_STEPS, n, rng, instr, "PNG") for n, instr in ((4, "pick can"), (2, "open drawer"))]
    root = tmp_path / "fractal20220817_data" / "0.1.0"
    _write(root, "fractal20220817_data", FRACTAL_STEPS, eps, [1, 1])
    ds = RLDSDataset(root)
    assert len(ds) == 6 and ds.tasks == ["pick can", "open drawer"]
    assert ds.instruction_key == "observation/natural_language_instruction"
    i = 0
    for e, ep in enumerate(eps):
        for t in range(len(ep["action/world_vector"])):
            item = ds[i]
            want = np.concatenate([ep["action/world_vector"][t], ep["action/rotation_delta"][t],
                                   ep["action/gripper_closedness_action"][t]])
            np.testing.assert_array_equal(item["actions"].numpy(), want[None])
            np.testing.assert_array_equal(item["state"].numpy(), np.concatenate(
                [ep["observation/base_pose_tool_reached"][t], ep["observation/gripper_closed"][t]]))
            png = np.asarray(Image.open(io.BytesIO(ep["observation/image"][t])))
            np.testing.assert_array_equal(item["image"].numpy(), png)
            assert (item["episode_index"], item["frame_index"], item["task_index"]) == (e, t, e)
            i += 1
    ds2 = RLDSDataset(root, action_keys=["base_displacement_vector", "terminate_episode"])
    np.testing.assert_array_equal(ds2[1]["actions"].numpy()[0], np.concatenate(
        [eps[0]["action/base_displacement_vector"][1], eps[0]["action/terminate_episode"][1]]))


def test_truncated_shard(tmp_path):
    """Oracle: the second shard (episode 2) cut by 7 bytes."""
    root, eps, paths = _bridge(tmp_path)
    paths[1].write_bytes(paths[1].read_bytes()[:-7])
    with pytest.raises(DataError, match=r"bridge-train\.tfrecord-00001-of-00002: record 0 at byte 0: truncated "
                                        r"data .*\(episode 2, field 'data'\)"):
        RLDSDataset(root)
    ds = RLDSDataset(root, on_error="skip")
    assert len(ds) == 8 and ds.skipped == {"truncated": 1} and ds.num_episodes == 2
    only = RLDSDataset(root, shards=[0])  # the intact shard alone reads without error
    assert len(only) == 8 and only.skipped == {}


def test_crc_mismatch(tmp_path):
    """Oracle: one byte inside episode 1's record (shard 0, record 1) flipped."""
    root, eps, paths = _bridge(tmp_path)
    from lf_data import iter_tfrecord

    offset = [off for _, off, _ in iter_tfrecord(paths[0])][1]
    raw = bytearray(paths[0].read_bytes())
    raw[offset + 40] ^= 0x55
    paths[0].write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"tfrecord-00000-of-00002: record 1 at byte \d+: data CRC mismatch .*"
                                        r"\(episode 1, field 'data'\)"):
        RLDSDataset(root)
    ds = RLDSDataset(root, on_error="skip")
    assert ds.skipped == {"crc": 1} and [ds[a]["episode_index"] for a, _ in ds.episode_ranges] == [0, 2]


def test_lfs_pointer_in_place_of_shard(tmp_path):
    """Oracle: shard 1 replaced by a Git LFS pointer file."""
    root, eps, paths = _bridge(tmp_path)
    paths[1].write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "a" * 64 + "\nsize 9\n")
    with pytest.raises(DataError, match=r"tfrecord-00001-of-00002: is a Git LFS pointer file.*episodes 2\.\.2, "
                                        r"field 'shard'") as e:
        RLDSDataset(root)
    assert e.value.field == "shard"
    assert RLDSDataset(root, on_error="skip").skipped == {"lfs_pointer": 1}


def test_non_finite_action(tmp_path):
    """Oracle: action[1, 4] of episode 1 set to inf."""
    def mutate(eps):
        eps[1]["action"][1, 4] = np.inf

    root, _, _ = _bridge(tmp_path, mutate=mutate)
    with pytest.raises(DataError, match=r"tfrecord-00000-of-00002: episode 1 field 'steps/action': non-finite "
                                        r"action value inf at step 1, dim 4"):
        RLDSDataset(root)
    ds = RLDSDataset(root, on_error="skip")
    assert ds.skipped == {"non_finite": 1} and len(ds) == 5


def test_missing_language_instruction(tmp_path):
    """Oracle: episode 0 written with an empty instruction at every step."""
    def mutate(eps):
        eps[0]["language_instruction"] = [b""] * len(eps[0]["language_instruction"])

    root, _, _ = _bridge(tmp_path, mutate=mutate)
    with pytest.raises(DataError, match=r"tfrecord-00000-of-00002: episode 0 field 'steps/language_instruction or "
                                        r"steps/observation/natural_language_instruction': no language instruction"):
        RLDSDataset(root)
    ds = RLDSDataset(root, on_error="skip")
    assert ds.skipped == {"missing_instruction": 1} and ds[0]["episode_index"] == 1


def test_bad_arguments_name_the_value(tmp_path):
    """Oracle: the argument checks' messages."""
    root, _, _ = _bridge(tmp_path)
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', got 'ignore'"):
        RLDSDataset(root, on_error="ignore")
    with pytest.raises(ValueError, match=r"split 'test' not found \(splits: \['train'\]\)"):
        RLDSDataset(root, split="test")


def test_episode_count_mismatch_and_missing_shard(tmp_path):
    """Oracle: dataset_info.json edited to declare 3 episodes in shard 0 (it holds 2); then shard 1 deleted."""
    root, _, paths = _bridge(tmp_path)
    info = json.loads((root / "dataset_info.json").read_text())
    info["splits"][0]["shardLengths"] = ["3", "1"]
    (root / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match=r"tfrecord-00000-of-00002: holds 2 episodes but dataset_info\.json declares "
                                        r"3 \(field 'shardLengths'\)"):
        RLDSDataset(root)
    paths[1].unlink()
    with pytest.raises(DataError, match=r"tfrecord-00001-of-00002: shard file missing .*episodes 3\.\.3, "
                                        r"field 'shard'"):
        RLDSDataset(root, shards=[1])
    assert RLDSDataset(root, on_error="skip").skipped == {"episode_count": 1, "missing_file": 1}


def test_wrong_number_of_values(tmp_path):
    """Oracle: episode 1 written with 6 action values per step where features.json declares 7."""
    def mutate(eps):
        eps[1]["action"] = eps[1]["action"][:, :6].copy()

    root, _, _ = _bridge(tmp_path, mutate=mutate)
    with pytest.raises(DataError, match=r"episode 1 field 'steps/action': holds 30 values, expected 5 steps x 7"):
        RLDSDataset(root)


def test_batches_through_dataloader(tmp_path):
    """Oracle: default collate of 4 items equals the stacked items."""
    import torch

    root, _, _ = _bridge(tmp_path)
    ds = RLDSDataset(root, action_horizon=3)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert batch["actions"].shape == (4, 3, 7) and batch["image"].shape == (4, 6, 5, 3)
    torch.testing.assert_close(batch["actions"], torch.stack([ds[i]["actions"] for i in range(4)]))
    assert batch["task"] == [ds[i]["task"] for i in range(4)]
