"""tests/device_report.py: its luggage (the shared pair packed to travel to a GPU machine, unpacked where it runs), and
the command rehearsed as a borrowed machine runs it: what comes back, also from a run killed mid-stage."""
import contextlib, importlib.metadata, json, os, pathlib, re, struct, subprocess, sys, time, zipfile
import numpy as np
from tinygrad import Tensor, dtypes
import models
from conftest import ROOT, read_safetensors, shared_dir
import device_report

# the stages' time limits stretched: CI runs these beside other work on 2 cores, and no verdict hangs on timings
SLACK = 10

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

# ***** the command as a borrowed GPU runs it: what comes back (8 files, 16 MiB each, 2 folders deep) *****

def wheel_of(dist:str, folder:pathlib.Path) -> pathlib.Path:
  """An installed distribution zipped as its wheel: what a machine without network carries (tinygrad's)."""
  d = importlib.metadata.distribution(dist)
  whl = folder / f"{dist}-{d.version}-py3-none-any.whl"
  with zipfile.ZipFile(whl, "w") as z:
    for f in d.files:
      path = d.locate_file(f)
      if not str(f).startswith("..") and f.suffix != ".pyc" and path.is_file(): z.write(path, str(f))
  return whl

def blocked(folder:pathlib.Path, *names:str) -> pathlib.Path:
  """A folder that, first on PYTHONPATH, makes names unimportable: a bare machine's Python."""
  for name in names:
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text("raise ImportError")
  return folder

def what_comes_back(out:pathlib.Path) -> list[str]:
  """What a lease would not bring back from its output folder, with out as the command's --out under it."""
  files = [f for f in out.parent.rglob("*") if f.is_file()]
  problems = [f"{len(files)} files" for _ in [0] if len(files) > 8]
  for f in files:
    rel = f.relative_to(out.parent)
    if f.stat().st_size > 16 << 20: problems.append(f"{rel}: {f.stat().st_size} bytes")
    if len(rel.parts) > 3: problems.append(f"{rel}: too deep")
    if not all(re.fullmatch(r"[A-Za-z0-9._-]+", p) for p in rel.parts): problems.append(f"{rel}: its name")
  return problems

def test_the_report_comes_back_from_a_borrowed_machine(tmp_path):
  """The documented command on a stand-in for a borrowed GPU (on the CPU, tiny stages): tinygrad and z3 unimportable
  until --wheels installs tinygrad's wheel, the packed pair, TIKTOKEN_CACHE_DIR naming a cache without GPT-2's
  tokenizer. It ends 0 with report.md and report.json alone in its folder, its headline measured on the packed pair."""
  shared_dir()
  device_report.pack(tmp_path / "pair", names=("docs-draft",))
  (whl := tmp_path / "whl").mkdir()
  wheel_of("tinygrad", whl)
  (empty := tmp_path / "no-tokenizer").mkdir()
  out = tmp_path / "lease-out" / "report"
  pair = [str(tmp_path / "pair" / "docs-draft")] * 2
  env = {**os.environ, "DEV": "CPU", "PYTHONPATH": str(blocked(tmp_path / "bare", "tinygrad", "z3")),
         "TIKTOKEN_CACHE_DIR": str(empty)}
  run = subprocess.run([sys.executable, str(ROOT / "tests" / "device_report.py"), "--tiny", "--out", str(out),
                        "--pair", *pair, "--wheels", str(whl), "--scratch", str(tmp_path / "scratch"),
                        "--stages", "device", "headline", "--slack", str(SLACK)], env=env, capture_output=True, text=True, cwd=tmp_path)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  assert sorted(f.name for f in out.iterdir()) == ["report.json", "report.md"] and what_comes_back(out) == []
  stages = json.loads((out / "report.json").read_text())["stages"]
  assert [s["status"] for s in stages.values()] == ["done", "done"]
  assert stages["headline"]["pair"]["target"] == "docs-draft" and len(stages["headline"]["decode"]) == 2
  assert "*headline: done after" in (out / "report.md").read_text()

def test_a_report_killed_mid_stage_reads_and_marks_the_stage_cut(tmp_path):
  """SIGKILL to the command inside its kernels stage: report.md and report.json stay whole, the stage marked running
  (a report that ends there was cut), and the stage's process ends with the command."""
  out, scratch = tmp_path / "out" / "report", tmp_path / "scratch"
  proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "device_report.py"), "--tiny", "--out", str(out),
                           "--scratch", str(scratch), "--stages", "device", "kernels", "--slack", str(SLACK)],
                          env={**os.environ, "DEV": "CPU"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    for _ in range(1200):
      with contextlib.suppress(FileNotFoundError, KeyError):
        if json.loads((out / "report.json").read_text())["stages"]["kernels"].get("rows"): break
      time.sleep(0.5)
  finally: proc.kill(); proc.wait()
  for _ in range(20):   # the stage's watch sees its parent gone within a second
    time.sleep(1)
    if not (alive := naming(scratch)): break
  assert alive == [], alive
  stages = json.loads((out / "report.json").read_text())["stages"]
  assert stages["device"]["status"] == "done" and stages["kernels"]["status"] == "running" and stages["kernels"]["rows"]
  assert "*kernels: running" in (out / "report.md").read_text() and what_comes_back(out) == []

def naming(folder:pathlib.Path) -> list[str]:
  """The processes whose command line names folder, where /proc lists them (Linux)."""
  alive = []
  for p in pathlib.Path("/proc").glob("[0-9]*"):
    with contextlib.suppress(OSError):
      if str(folder) in (p / "cmdline").read_bytes().decode(errors="replace"): alive.append(p.name)
  return alive

def test_the_profile_predicts_with_the_constants_of_the_gpu_it_is_on():
  """tests/gpu_profile.py's model takes the copy rate and multiprocessors of the GPU nvidia-smi names (an H200's are
  not an H100's); where it names none of its GPUs (no nvidia-smi, another GPU), the H100's, which the report says."""
  import gpu_profile
  try:
    assert gpu_profile.use("NVIDIA H200, 565.57.01, 143771 MiB") == "H200"
    assert (gpu_profile.BANDWIDTH, gpu_profile.SMS) == gpu_profile.GPUS["H200"] != gpu_profile.GPUS["H100"]
    assert gpu_profile.use("NVIDIA H100 80GB HBM3") == "H100" and gpu_profile.use("") == "H100"
    assert (gpu_profile.BANDWIDTH, gpu_profile.SMS) == gpu_profile.GPUS["H100"]
  finally: gpu_profile.use("H100")
