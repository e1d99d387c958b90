"""tests/device_report.py's luggage: the shared pair packed to travel to a GPU machine and unpacked where it runs."""
import json, struct
import numpy as np
from tinygrad import Tensor, dtypes
import models
from conftest import read_safetensors, shared_dir
import device_report

def read_half(fn) -> dict[str, np.ndarray]:
  raw = fn.read_bytes()
  n = struct.unpack("<Q", raw[:8])[0]
  header = json.loads(raw[8:8 + n])
  assert {v["dtype"] for v in header.values()} == {"F16"}
  return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float16).reshape(v["shape"])
          for k, v in header.items()}

def test_a_packed_checkpoint_unpacks_to_its_weights_in_float16(tmp_path):
  """pack() then unpacked() on the shared draft: every weight but the causal mask, rounded to float16 and nothing else,
  its config and GPT-2's tokenizer beside it; spec loads it, and its logits are the float32 checkpoint's within
  float16's tolerance."""
  shared = shared_dir()
  device_report.pack(tmp_path / "packed", names=("docs-draft",))
  assert (tmp_path / "packed" / "tiktoken").is_dir()
  unpacked = device_report.unpacked(tmp_path / "packed" / "docs-draft", tmp_path)
  original = read_safetensors(shared / "docs-draft" / "model.safetensors")
  got = read_half(unpacked / "model.safetensors")
  assert set(got) == {k for k in original if not k.endswith(".attn.bias")}
  for k, v in got.items(): np.testing.assert_array_equal(v, original[k].astype(np.float16), err_msg=k)
  tokens = Tensor([[models.EOT, 464, 3290, 318, 257]], dtype=dtypes.int32)
  logits = [models.load(str(d), "float32", plain=True).forward(tokens, 0).numpy() for d in (unpacked, shared / "docs-draft")]
  assert np.abs(logits[0] - logits[1]).max() < 1e-2 * np.abs(logits[1]).max()
