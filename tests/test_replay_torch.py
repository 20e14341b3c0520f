"""sample_batch(device=...): the native batch as torch tensors, the same
values, dtypes and shapes as the numpy batch of the same draw, the CPU's
sharing the drawn arrays' memory; torch imported only then; every refusal
before anything is drawn."""
from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from episode import MultiAgentEpisode, SingleAgentEpisode
from difftools import compare
from replay_tools import plain_state
from episode.replay import (EpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer,
                            MultiAgentPrioritizedEpisodeReplayBuffer,
                            PrioritizedEpisodeReplayBuffer)

torch = pytest.importorskip("torch")

STEP_BITS = (1 << 56) - 1      # an index without its store's tag

SPACE = gym.spaces.Dict({
    "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    "more": gym.spaces.Tuple((gym.spaces.Discrete(3),
                              gym.spaces.Box(0, 255, (2, 2), np.uint8))),
})


def _dict_episodes(count: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    episodes = []
    for k in range(count):
        n = 3 + k % 5
        obs = [{"pos": rng.random(2, np.float32),
                "more": (int(rng.integers(3)), rng.integers(0, 255, (2, 2), np.uint8))}
               for _ in range(n + 1)]
        episodes.append(SingleAgentEpisode(
            observations=obs, actions=[int(a) for a in rng.integers(0, 2, n)],
            rewards=[float(r) for r in rng.random(n)], observation_space=SPACE,
            extra_model_outputs={"vf": [np.float32(v) for v in rng.random(n)]},
            terminated=k % 2 == 0, truncated=k % 2 == 1, len_lookback_buffer=0))
    return episodes


def _leaves(batch, path=()):
    if isinstance(batch, dict):
        for key, value in batch.items():
            yield from _leaves(value, path + (key,))
    elif isinstance(batch, tuple):
        for i, value in enumerate(batch):
            yield from _leaves(value, path + (i,))
    else:
        yield path, batch


def _same(arrays, tensors, device="cpu") -> None:
    """The tensors are the arrays: same nesting, dtype, shape and values."""
    flat_a, flat_t = list(_leaves(arrays)), list(_leaves(tensors))
    assert [p for p, _ in flat_a] == [p for p, _ in flat_t]
    for (path, array), (_, tensor) in zip(flat_a, flat_t):
        assert isinstance(tensor, torch.Tensor), path
        assert tensor.device == torch.device(device), path
        assert tuple(tensor.shape) == array.shape, path
        assert tensor.dtype == torch.from_numpy(np.zeros(0, array.dtype)).dtype, path
        if device == "cpu":
            values = tensor.numpy()
            if path == ("indices",):
                # (Each store tags its indices in the top bits.)
                values, array = values & STEP_BITS, array & STEP_BITS
            np.testing.assert_array_equal(values, array, err_msg=str(path))


def _same_state(one, two) -> None:
    compare(plain_state(one.get_state()), plain_state(two.get_state()))


def _buffers(cls, episodes, seed=5):
    one, two = cls(capacity=1000, seed=seed), cls(capacity=1000, seed=seed)
    one.add(episodes)
    two.add(episodes)
    return one, two


CALLS = [dict(n_step=1), dict(n_step=3, gamma=0.9, include_extra_model_outputs=True),
         dict(n_step=(1, 4)), dict(batch_length_T=4, lookback=1),
         dict(batch_length_T=3, include_extra_model_outputs=True, min_batch_length_T=1)]


@pytest.mark.parametrize("cls", [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer])
@pytest.mark.parametrize("call", CALLS, ids=[str(c) for c in CALLS])
def test_tensors_are_the_numpy_batch_of_the_same_draw(cls, call):
    numpy_buffer, torch_buffer = _buffers(cls, _dict_episodes(12))
    for _ in range(3):
        arrays = numpy_buffer.sample_batch(16, **call)
        tensors = torch_buffer.sample_batch(16, device="cpu", **call)
        _same(arrays, tensors)
        assert isinstance(tensors["obs"]["more"], tuple)
        if "batch_length_T" in call:
            assert tensors["mask"].dtype == torch.bool and tensors["mask"].shape[0] == 16
    _same_state(numpy_buffer, torch_buffer)


def test_cpu_tensors_share_the_drawn_arrays_memory():
    buffer = EpisodeReplayBuffer(capacity=1000, seed=0)
    buffer.add(_dict_episodes(6))
    drawn = []
    native = buffer._native_batch
    buffer._native_batch = lambda *a: drawn.append(native(*a)) or drawn[-1]
    tensors = buffer.sample_batch(8, batch_length_T=3, device=torch.device("cpu"))
    pairs = list(zip(_leaves(drawn[0]), _leaves(tensors)))
    assert len(pairs) == 14
    for (path, array), (_, tensor) in pairs:
        assert tensor.data_ptr() == array.ctypes.data, path


def test_another_device_gets_copies_there():
    # ("meta" is a device every torch build has: shapes and dtypes, no data.)
    numpy_buffer, torch_buffer = _buffers(EpisodeReplayBuffer, _dict_episodes(8))
    arrays = numpy_buffer.sample_batch(8, n_step=2)
    tensors = torch_buffer.sample_batch(8, n_step=2, device="meta")
    _same(arrays, tensors, device="meta")


def test_prioritized_takes_its_tensors_back():
    numpy_buffer, torch_buffer = _buffers(PrioritizedEpisodeReplayBuffer, _dict_episodes(10))
    for _ in range(4):
        arrays = numpy_buffer.sample_batch(16, n_step=2, beta=0.4)
        tensors = torch_buffer.sample_batch(16, n_step=2, beta=0.4, device="cpu")
        _same(arrays, tensors)
        numpy_buffer.update_priorities(np.abs(arrays["rewards"]) + 0.1,
                                       indices=arrays["indices"])
        torch_buffer.update_priorities(tensors["rewards"].abs() + 0.1,
                                       indices=tensors["indices"])
    _same_state(numpy_buffer, torch_buffer)


def _multi_episodes() -> list:
    episodes = []
    for k in range(4):
        m = MultiAgentEpisode(agent_to_module_mapping_fn=lambda aid, ep: f"m_{aid}")
        m.add_env_reset(observations={"a": np.zeros(2, np.float32), "b": np.ones(2, np.float32)})
        for t in range(1, 6 + k):
            m.add_env_step({"a": np.full(2, t, np.float32), "b": np.full(2, -t, np.float32)},
                           {"a": 1, "b": 0}, {"a": 5.0 + t, "b": float(k)},
                           terminateds={"__all__": t == 5 + k})
        episodes.append(m)
    return episodes


@pytest.mark.parametrize("cls", [MultiAgentEpisodeReplayBuffer,
                                 MultiAgentPrioritizedEpisodeReplayBuffer])
def test_multi_agent_tensors_per_module(cls):
    numpy_buffer, torch_buffer = _buffers(cls, _multi_episodes())
    for call in ({"n_step": 2}, {"batch_length_T": 3}):
        arrays = numpy_buffer.sample_batch(6, **call)
        tensors = torch_buffer.sample_batch(6, device="cpu", **call)
        assert list(tensors) == list(arrays) and sorted(arrays) == ["m_a", "m_b"]
        for module_id in arrays:
            _same(arrays[module_id], tensors[module_id])
    assert tensors["m_a"]["obs"].shape == (6, 3, 2)
    if cls is MultiAgentPrioritizedEpisodeReplayBuffer:
        arrays = numpy_buffer.sample_batch(6, modules_to_sample=["m_b"])
        tensors = torch_buffer.sample_batch(6, modules_to_sample=["m_b"], device="cpu")
        numpy_buffer.update_priorities(np.full(6, 2.0), "m_b", indices=arrays["m_b"]["indices"])
        torch_buffer.update_priorities(torch.full((6,), 2.0, dtype=torch.float64), "m_b",
                                       indices=tensors["m_b"]["indices"])
    _same_state(numpy_buffer, torch_buffer)


def _unchanged_after(buffer, call) -> None:
    """`call` raises, and the buffer draws on as if it had not been made."""
    twin = type(buffer)(capacity=1000, seed=7)
    twin.set_state(buffer.get_state())
    buffer.rng = np.random.default_rng(7)
    state = plain_state(buffer.get_state())
    call()
    compare(plain_state(buffer.get_state()), state)
    np.testing.assert_array_equal(buffer.sample_batch(4)["indices"] & STEP_BITS,
                                  twin.sample_batch(4)["indices"] & STEP_BITS)


@pytest.mark.parametrize("device, error, words", [
    ("nowhere", ValueError, "names no torch device"),
    (-1, ValueError, "names no torch device"),
    ("cuda:7", ValueError, "not available"),
    (1.5, TypeError, "device must be"),
    (True, TypeError, "device must be"),
    (["cpu"], TypeError, "device must be"),
])
def test_a_bad_device_is_refused_before_the_draw(device, error, words):
    if device == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    buffer = PrioritizedEpisodeReplayBuffer(capacity=1000)
    buffer.add(_dict_episodes(5))

    def call():
        with pytest.raises(error, match=words):
            buffer.sample_batch(4, device=device)
    _unchanged_after(buffer, call)


def test_objects_make_no_tensors_and_nothing_is_drawn():
    buffer = EpisodeReplayBuffer(capacity=1000)
    buffer.add(SingleAgentEpisode(observations=["a", "b", "c"], actions=[0, 1],
                                  rewards=[1.0, 2.0], len_lookback_buffer=0))

    def call():
        with pytest.raises(TypeError, match="'obs' hold Python objects"):
            buffer.sample_batch(4, device="cpu")
    _unchanged_after(buffer, call)


def test_without_torch_an_import_error_names_it(monkeypatch):
    buffer = EpisodeReplayBuffer(capacity=1000)
    buffer.add(_dict_episodes(3))
    monkeypatch.setitem(sys.modules, "torch", None)

    def call():
        with pytest.raises(ImportError, match="needs torch.*pip install torch") as raised:
            buffer.sample_batch(4, device="cpu")
        assert raised.value.name == "torch"
    _unchanged_after(buffer, call)
    assert isinstance(buffer.sample_batch(2)["obs"]["pos"], np.ndarray)


def test_importing_the_replay_package_does_not_import_torch():
    code = ("import sys, episode, episode.replay, episode.replay.tensors\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
