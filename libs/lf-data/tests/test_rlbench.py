"""RLBenchDataset on demos written the way rlbench/dataset_generator.py writes them.

Pickles are made from locally defined classes registered as ``rlbench.demo.Demo`` and
``rlbench.backend.observation.Observation`` in fake ``sys.modules`` entries, which are removed
before reading: the allow-listed unpickler must not import (or need) rlbench.
"""

from __future__ import annotations

import os
import pickle
import sys
import types

import numpy as np
import pytest
from PIL import Image

from lf_data import DataError, RLBenchDataset
from lf_data.rlbench import DEPTH_SCALE, safe_load

NAMES = ["rlbench", "rlbench.demo", "rlbench.backend", "rlbench.backend.observation"]
NEAR_FAR = {"front": (0.1, 3.5), "wrist": (0.01, 1.5)}
H, W = 5, 4


def _fake_rlbench():
    """Classes named as RLBench names them, importable by pickle while the fake modules exist."""
    assert not any(n in sys.modules for n in NAMES), "a real rlbench is imported; these tests need it absent"
    mods = {n: types.ModuleType(n) for n in NAMES}

    class Observation:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    class Demo:
        def __init__(self, observations, random_seed=None, num_reset_attempts=None):
            self._observations = observations
            self.random_seed = random_seed
            self.num_reset_attempts = num_reset_attempts

    for cls, mod in ((Observation, "rlbench.backend.observation"), (Demo, "rlbench.demo")):
        cls.__module__, cls.__qualname__ = mod, cls.__name__
        setattr(mods[mod], cls.__name__, cls)
    sys.modules.update(mods)
    return Demo, Observation


def _remove_fake():
    for n in NAMES:
        sys.modules.pop(n, None)


def _rgb_depth(depth01: np.ndarray) -> np.ndarray:
    """rlbench.backend.utils.float_array_to_rgb_image with scale 2**24 - 1, as uint8 (H, W, 3)."""
    code = np.clip(np.floor(depth01 * DEPTH_SCALE + 0.5), 0, DEPTH_SCALE).astype(np.uint32)
    return np.stack([code // 65536, (code // 256) % 256, code % 256], -1).astype(np.uint8)


def _write_demo(root, task, var, ep, steps, rng, *, protocol=4, cameras=("front", "wrist"), descriptions=None):
    """One episode folder; returns the written values."""
    Demo, Observation = _fake_rlbench()
    try:
        vdir = root / task / f"variation{var}"
        edir = vdir / "episodes" / f"episode{ep}"
        edir.mkdir(parents=True)
        if descriptions is not False:
            with open(vdir / "variation_descriptions.pkl", "wb") as f:
                pickle.dump(descriptions or [f"{task} variant {var}", "paraphrase"], f)
        written = {"joint_positions": rng.normal(size=(steps, 7)), "gripper_open": (np.arange(steps) % 2).astype(float),
                   "gripper_pose": rng.normal(size=(steps, 7))}
        obs = []
        for t in range(steps):
            misc = {}
            for cam in cameras:
                near, far = NEAR_FAR[cam]
                misc.update({f"{cam}_camera_near": near, f"{cam}_camera_far": far,
                             f"{cam}_camera_extrinsics": np.eye(4), f"{cam}_camera_intrinsics": np.eye(3)})
                rgb = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
                depth01 = rng.uniform(0, 1, (H, W))
                mask = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
                for kind, img in (("rgb", rgb), ("depth", _rgb_depth(depth01)), ("mask", mask)):
                    (edir / f"{cam}_{kind}").mkdir(exist_ok=True)
                    Image.fromarray(img).save(edir / f"{cam}_{kind}" / f"{t}.png")
                    written.setdefault(f"{cam}_{kind}", []).append(img)
                written.setdefault(f"{cam}_depth01", []).append(depth01)
            obs.append(Observation(
                joint_positions=written["joint_positions"][t], gripper_open=float(written["gripper_open"][t]),
                gripper_pose=written["gripper_pose"][t], joint_velocities=rng.normal(size=7),
                gripper_matrix=np.eye(4), task_low_dim_state=rng.normal(size=5), misc=misc,
                front_rgb=None, front_depth=None, front_mask=None, wrist_rgb=None, wrist_depth=None,
                ignore_collisions=np.array(1.0)))
        with open(edir / "low_dim_obs.pkl", "wb") as f:
            pickle.dump(Demo(obs, random_seed=("MT19937", np.arange(4, dtype=np.uint32), 0, 0, 0.0)), f,
                        protocol=protocol)
        return written
    finally:
        _remove_fake()


@pytest.mark.parametrize("protocol", [0, 1, 2, 4, 5])
def test_round_trip_equals_written_values(tmp_path, protocol):
    """Oracle: the written arrays and PNG bytes; depth = near + code / (2**24 - 1) * (far - near) with the
    24-bit code written (and within one code step of the original depth); mask = R + 256 G + 65536 B."""
    rng = np.random.default_rng(protocol)
    eps = [("reach_target", 0, 0, 4), ("reach_target", 1, 0, 3), ("open_drawer", 0, 0, 2)]
    written = [_write_demo(tmp_path, t, v, e, n, rng, protocol=protocol) for t, v, e, n in eps]
    assert "rlbench" not in sys.modules
    ds = RLBenchDataset(tmp_path, cameras=("front", "wrist"), action_horizon=2, depth=True, mask=True)
    assert "rlbench" not in sys.modules
    assert len(ds) == 3 + 2 + 1 and ds.num_episodes == 3
    # tasks are visited sorted: open_drawer first
    order = [2, 0, 1]
    assert ds.tasks == ["open_drawer variant 0", "reach_target variant 0", "reach_target variant 1"]
    i = 0
    for k, e in enumerate(order):
        w, steps = written[e], eps[e][3]
        for t in range(steps - 1):
            item = ds[i]
            np.testing.assert_array_equal(item["state"].numpy(), np.concatenate(
                [w["joint_positions"][t], [w["gripper_open"][t]]]).astype(np.float32))
            nxt = np.minimum(t + 1 + np.arange(2), steps - 1)
            np.testing.assert_array_equal(item["actions"].numpy(), np.concatenate(
                [w["joint_positions"][nxt], w["gripper_open"][nxt, None]], 1).astype(np.float32))
            assert item["action_is_pad"].tolist() == [t + j >= steps - 1 for j in range(2)]
            assert (item["episode_index"], item["frame_index"], item["task_index"], item["variation"]) == \
                (k, t, k, eps[e][1])
            for cam in ("front", "wrist"):
                np.testing.assert_array_equal(item["images"][cam].numpy(), w[f"{cam}_rgb"][t])
                near, far = NEAR_FAR[cam]
                rgb = w[f"{cam}_depth"][t].astype(np.int64)
                code = rgb[..., 0] * 65536 + rgb[..., 1] * 256 + rgb[..., 2]
                depth = item["depth"][cam].numpy()
                np.testing.assert_array_equal(depth, (near + code / DEPTH_SCALE * (far - near)).astype(np.float32))
                np.testing.assert_allclose(depth, near + w[f"{cam}_depth01"][t] * (far - near), atol=1e-6)
                m = w[f"{cam}_mask"][t].astype(np.int64)
                handles = m[..., 0] + 256 * m[..., 1] + 65536 * m[..., 2]
                np.testing.assert_array_equal(item["mask"][cam].numpy(), handles)
            np.testing.assert_array_equal(item["image"].numpy(), w["front_rgb"][t])
            i += 1
    assert ds.descriptions[("reach_target", 1)] == ["reach_target variant 1", "paraphrase"]


def test_ee_pose_action_space(tmp_path):
    """Oracle: action = next gripper_pose (7) ++ next gripper_open."""
    w = _write_demo(tmp_path, "push_button", 0, 0, 3, np.random.default_rng(0), cameras=("front",))
    ds = RLBenchDataset(tmp_path, action_space="ee_pose")
    np.testing.assert_array_equal(ds[0]["actions"].numpy()[0], np.concatenate(
        [w["gripper_pose"][1], [w["gripper_open"][1]]]).astype(np.float32))
    assert "images" not in ds[0] and "depth" not in ds[0]


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_malicious_pickle_is_refused_without_running(tmp_path):
    """Oracle: pickles whose __reduce__ calls os.system / builtins.eval; the marker file must not appear."""
    _write_demo(tmp_path, "reach_target", 0, 0, 3, np.random.default_rng(0), cameras=("front",))
    marker = tmp_path / "pwned"
    pkl = tmp_path / "reach_target/variation0/episodes/episode0/low_dim_obs.pkl"
    pkl.write_bytes(pickle.dumps([_Evil(marker)]))
    with pytest.raises(DataError, match=r"low_dim_obs\.pkl: pickle refers to (posix|os|nt)\.system, which is not "
                                        r"allowed") as e:
        RLBenchDataset(tmp_path)
    assert not marker.exists() and e.value.reason == "forbidden_class"
    assert e.value.episode == "reach_target/variation0/episode0"
    ds = RLBenchDataset(tmp_path, on_error="skip")
    assert len(ds) == 0 and ds.skipped == {"forbidden_class": 1} and not marker.exists()
    evil = tmp_path / "eval.pkl"
    evil.write_bytes(b"cbuiltins\neval\n(Vprint(1)\ntR.")
    with pytest.raises(DataError, match=r"builtins\.eval, which is not allowed"):
        safe_load(evil)


def _two_episodes(tmp_path, steps=4):
    rng = np.random.default_rng(0)
    return [_write_demo(tmp_path, "reach_target", 0, e, steps, rng, cameras=("front",)) for e in range(2)]


def test_png_count_mismatch(tmp_path):
    """Oracle: front_rgb/2.png of episode1 deleted -> 3 PNGs for 4 observations."""
    _two_episodes(tmp_path)
    (tmp_path / "reach_target/variation0/episodes/episode1/front_rgb/2.png").unlink()
    with pytest.raises(DataError, match=r"episode1/front_rgb: episode reach_target/variation0/episode1 field "
                                        r"'front_rgb': 3 PNGs in .*expected 0\.png\.\.3\.png"):
        RLBenchDataset(tmp_path)
    ds = RLBenchDataset(tmp_path, on_error="skip")
    assert ds.skipped == {"frame_count": 1} and len(ds) == 3 and ds[0]["episode_index"] == 0


def test_non_finite_joint_positions(tmp_path):
    """Oracle: an episode pickled with joint_positions[2][3] = nan."""
    rng = np.random.default_rng(0)
    _write_demo(tmp_path, "reach_target", 0, 0, 4, rng, cameras=("front",))
    Demo, Observation = _fake_rlbench()
    try:
        pkl = tmp_path / "reach_target/variation0/episodes/episode0/low_dim_obs.pkl"
        obs = [Observation(joint_positions=np.full(7, np.nan if t == 2 else 0.5), gripper_open=1.0) for t in range(4)]
        pkl.write_bytes(pickle.dumps(Demo(obs)))
    finally:
        _remove_fake()
    with pytest.raises(DataError, match=r"low_dim_obs\.pkl: episode reach_target/variation0/episode0 field "
                                        r"'joint_positions': non-finite value nan at step 2"):
        RLBenchDataset(tmp_path)
    assert RLBenchDataset(tmp_path, on_error="skip").skipped == {"non_finite": 1}


def test_missing_or_empty_variation_descriptions(tmp_path):
    """Oracle: variation_descriptions.pkl deleted, then written as an empty list."""
    _two_episodes(tmp_path)
    path = tmp_path / "reach_target/variation0/variation_descriptions.pkl"
    path.unlink()
    with pytest.raises(DataError, match=r"variation_descriptions\.pkl: missing, so episode "
                                        r"reach_target/variation0/episode0 has no language instruction") as e:
        RLBenchDataset(tmp_path)
    assert e.value.field == "variation_descriptions" and e.value.reason == "missing_instruction"
    path.write_bytes(pickle.dumps([]))
    with pytest.raises(DataError, match=r"episode reach_target/variation0/episode0 field 'variation_descriptions': "
                                        r"no language instruction"):
        RLBenchDataset(tmp_path)
    assert RLBenchDataset(tmp_path, on_error="skip").skipped == {"missing_instruction": 2}


def test_lfs_pointer_in_place_of_pickle(tmp_path):
    """Oracle: episode0's low_dim_obs.pkl replaced by a Git LFS pointer file."""
    _two_episodes(tmp_path)
    pkl = tmp_path / "reach_target/variation0/episodes/episode0/low_dim_obs.pkl"
    pkl.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "b" * 64 + "\nsize 5\n")
    with pytest.raises(DataError, match=r"episode0/low_dim_obs\.pkl: is a Git LFS pointer file") as e:
        RLBenchDataset(tmp_path)
    assert e.value.episode == "reach_target/variation0/episode0" and e.value.field == "low_dim_obs.pkl"
    ds = RLBenchDataset(tmp_path, on_error="skip")
    assert ds.skipped == {"lfs_pointer": 1} and ds[0]["episode_index"] == 1


def test_truncated_pickle(tmp_path):
    """Oracle: episode1's pickle cut in half."""
    _two_episodes(tmp_path)
    pkl = tmp_path / "reach_target/variation0/episodes/episode1/low_dim_obs.pkl"
    pkl.write_bytes(pkl.read_bytes()[: pkl.stat().st_size // 2])
    with pytest.raises(DataError, match=r"episode1/low_dim_obs\.pkl: cannot unpickle"):
        RLBenchDataset(tmp_path)


def test_pickle_cannot_call_ndarray_with_a_raw_object_buffer(tmp_path):
    """Oracle: numpy.ndarray((1,), object, buffer=8 raw bytes) would make an object array of a forged
    pointer; the unpickler must refuse to call ndarray, while normal arrays (all protocols) still load."""
    evil = tmp_path / "ptr.pkl"
    evil.write_bytes(b"cnumpy\nndarray\n((I1\ntVO\nC\x08AAAAAAAAtR.")
    with pytest.raises(DataError, match=r"ptr\.pkl: cannot unpickle \(TypeError"):
        safe_load(evil)
    for protocol in (0, 1, 2, 4, 5):
        ok = tmp_path / f"ok{protocol}.pkl"
        ok.write_bytes(pickle.dumps({"a": np.arange(6.0).reshape(2, 3), "o": np.array([1, "x"], dtype=object)},
                                    protocol=protocol))
        got = safe_load(ok)
        np.testing.assert_array_equal(got["a"], np.arange(6.0).reshape(2, 3))
        assert type(got["a"]) is np.ndarray and got["o"].tolist() == [1, "x"]


@pytest.mark.parametrize("protocol", [0, 1, 2])
def test_python2_names_of_protocols_0_to_2_load(tmp_path, protocol):
    """Oracle: the written values. Protocols 0-2 name builtins and copyreg as Python 2 did (``__builtin__.object``,
    ``__builtin__.bytes`` for ``b""``, ``__builtin__.set``, ``copy_reg._reconstructor``), which the unpickler maps
    as ``pickle`` does with ``fix_imports``."""
    Demo, Observation = _fake_rlbench()
    try:
        value = Demo([Observation(misc={"empty": b"", "raw": b"\x00\xff", "s": {1, 2}, "f": frozenset("ab"),
                                        "x": np.float32(1.5), "o": np.array([1, "x"], dtype=object)},
                                  joint_positions=np.arange(7.0))], random_seed=None)
        data = pickle.dumps(value, protocol=protocol)
    finally:
        _remove_fake()
    assert (b"__builtin__" in data) and (protocol == 2 or b"copy_reg" in data)
    (tmp_path / "p.pkl").write_bytes(data)
    got = safe_load(tmp_path / "p.pkl")
    misc = got[0].misc
    assert misc["empty"] == b"" and misc["raw"] == b"\x00\xff" and misc["s"] == {1, 2}
    assert misc["f"] == frozenset("ab") and misc["x"] == np.float32(1.5) and misc["o"].tolist() == [1, "x"]
    np.testing.assert_array_equal(got[0].joint_positions, np.arange(7.0))


@pytest.mark.parametrize(("raw", "named"), [
    (b"c__builtin__\neval\n(Vprint(1)\ntR.", r"__builtin__\.eval \(Python 3: builtins\.eval\)"),
    (b"cposix\nsystem\n(Vtouch {m}\ntR.", r"posix\.system,"),
    (b"cnt\nsystem\n(Vtouch {m}\ntR.", r"nt\.system,"),
    (b"ccommands\ngetoutput\n(Vtouch {m}\ntR.", r"commands\.getoutput \(Python 3: subprocess\.getoutput\)"),
    (b"c__builtin__\ngetattr\n(c__builtin__\nobject\nV__subclasses__\ntR.", r"__builtin__\.getattr"),
])
def test_python2_named_callables_are_still_refused(tmp_path, raw, named):
    """Oracle: the marker (absent) and the name in the message, as the file spells it."""
    marker = tmp_path / "pwned"
    (tmp_path / "evil.pkl").write_bytes(raw.replace(b"{m}", str(marker).encode()))
    with pytest.raises(DataError, match=rf"evil\.pkl: pickle refers to {named}.* which is not allowed"):
        safe_load(tmp_path / "evil.pkl")
    assert not marker.exists()


def test_bytes_with_an_argument_is_refused(tmp_path):
    """Oracle: ``bytes(10**12)`` would allocate a terabyte; only ``bytes()`` (how protocols 0-2 write b"") loads."""
    (tmp_path / "big.pkl").write_bytes(b"c__builtin__\nbytes\n(I1000000000000\ntR.")
    with pytest.raises(DataError, match=r"big\.pkl: cannot unpickle \(UnpicklingError: builtins\.bytes refused"):
        safe_load(tmp_path / "big.pkl")
