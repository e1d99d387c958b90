"""tools/device_report.py: its luggage (the shared pair, the tokenizer and tinygrad's wheel packed to travel to a GPU
machine, unpacked where it runs), and the documented call rehearsed as a lent machine runs it: what comes back, also
from a run killed mid-stage."""
import contextlib, json, os, pathlib, re, shutil, struct, subprocess, sys, time
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

def test_the_luggage_unpacks_to_the_pair_in_float16_and_travels_within_the_limit(tmp_path):
  """pack() on the shared deep pair: what travels with the code (the luggage and the files git would send) stays under
  TRAVELS; the draft unpacks to every weight but the causal mask, rounded to float16 and nothing else, its config
  beside it, and spec loads it, its logits the float32 checkpoint's within float16's tolerance; the tokenizer and
  tinygrad's wheel come back whole from their xz."""
  import lzma, zipfile
  shared = shared_dir()
  travels = device_report.pack(tmp_path / "packed")
  assert travels < device_report.TRAVELS, f"{travels / 2**20:.1f} MiB travel"
  unpacked = device_report.unpacked(tmp_path / "packed" / "docs-draft", tmp_path)
  original = read_safetensors(shared / "docs-draft" / "model.safetensors")
  got = read_half(unpacked / "model.safetensors")
  assert set(got) == {k for k in original if not k.endswith(".attn.bias")}
  for k, v in got.items(): np.testing.assert_array_equal(v, original[k].astype(np.float16), err_msg=k)
  tokens = Tensor([[models.EOT, 464, 3290, 318, 257]], dtype=dtypes.int32)
  logits = [models.load(str(d), "float32", plain=True).forward(tokens, 0).numpy()
            for d in (unpacked, shared / "docs-draft")]
  assert np.abs(logits[0] - logits[1]).max() < 1e-2 * np.abs(logits[1]).max()
  for f in (shared / "tiktoken").iterdir():
    assert lzma.decompress((tmp_path / "packed" / "tiktoken" / f"{f.name}.xz").read_bytes()) == f.read_bytes()
  (whl,) = (tmp_path / "packed" / "wheels").glob("tinygrad-*.whl.xz")
  (tmp_path / "tinygrad.whl").write_bytes(lzma.decompress(whl.read_bytes()))
  assert "tinygrad/tensor.py" in zipfile.ZipFile(tmp_path / "tinygrad.whl").namelist()

# ***** the call as a lent GPU runs it: what comes back (8 files, 16 MiB each, 2 folders deep) *****

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

def documented_call() -> str:
  """The device tool's command as docs/backends.md gives it."""
  text = (ROOT / "docs" / "backends.md").read_text()
  (command,) = re.findall(r"^    command: (.+)$", text, re.M)
  assert len(command) < 2000 and " python3 " in command and re.search(r'^    carry: \["\.pair"\]$', text, re.M)
  return command

def rehearsal(tmp_path, *extra:str, stages=("device", "headline", "pair")) -> tuple[list[str], dict, pathlib.Path]:
  """The documented call on a stand-in for a lent GPU, on the CPU: DEV=CPU, --tiny, the stages' limits stretched,
  tinygrad and z3 unimportable until --wheels installs tinygrad's, the luggage (the shared draft packed as both models
  of the pair), TIKTOKEN_CACHE_DIR naming a cache without GPT-2's tokenizer. Returns the command, its environment and
  its --out."""
  shared_dir()
  (root := tmp_path / "tree").mkdir()
  device_report.pack(root / ".pair", names=("docs-draft",))
  shutil.copytree(root / ".pair" / "docs-draft", root / ".pair" / "docs-deep")
  (empty := tmp_path / "no-tokenizer").mkdir()
  out = tmp_path / "lease-out" / "report"
  command = documented_call().replace("DEV=CUDA ", "").replace("$OUT", str(out.parent))
  cmd = [sys.executable if w == "python3" else str(ROOT / w) if w.startswith("tools/") else w for w in command.split()]
  env = {**os.environ, "DEV": "CPU", "PYTHONPATH": str(blocked(tmp_path / "bare", "tinygrad", "z3")),
         "TIKTOKEN_CACHE_DIR": str(empty)}
  return cmd + ["--tiny", "--scratch", str(tmp_path / "scratch"), "--stages", *stages, "--slack", str(SLACK),
                *extra], env, out

def test_the_report_comes_back_from_a_lent_machine(tmp_path):
  """The documented call, rehearsed (rehearsal()): it ends 0 with report.md and report.json alone in its folder, every
  headline row against the floor in both files, the pair's speedup measured on the packed pair."""
  cmd, env, out = rehearsal(tmp_path)
  run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path / "tree")
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  assert sorted(f.name for f in out.iterdir()) == ["report.json", "report.md"] and what_comes_back(out) == []
  report = json.loads((out / "report.json").read_text())
  stages, md = report["stages"], (out / "report.md").read_text()
  assert [s["status"] for s in stages.values()] == ["done"] * 3 and report["not_reached"] == []
  assert stages["device"]["floor_bandwidth"] > 0
  rows = stages["headline"]["decode"]
  dtypes_ = device_report.dtype_names()
  assert [(r["dtype"], r["layer"]) for r in rows] == [(d, l) for d in dtypes_ for l in ("plain", "engine")]
  headline = md[md.index("## Headline"):md.index("## The deep pair")]
  assert "random weights" in headline.lower()
  for r in rows:
    line = next(l for l in headline.splitlines() if l.startswith(f"| gpt2-xl | {r['dtype']} | {r['layer']} |"))
    floor = stages["device"]["floor_bandwidth"]
    assert line.split("|")[5].strip() == device_report.ratio(r["ms"], r["weight_bytes"], floor) != "-"
  pair = stages["pair"]["pair"]
  assert pair["target"] == "docs-deep" and pair["prompts"] == 4 and pair["speedup"] > 0
  assert f"**{pair['speedup']:.2f}x** the target alone" in md and "*pair: done after" in md

def test_a_report_killed_mid_stage_names_the_cut_stage_and_those_not_reached(tmp_path):
  """SIGKILL to the documented call inside its headline (a row saved): report.md and report.json stay whole, the
  headline marked running (a report that ends there was cut), the stages after it named as not reached, and the
  stage's process ends with the command."""
  cmd, env, out = rehearsal(tmp_path, stages=("device", "headline", "pair", "kernels"))
  scratch = tmp_path / "scratch"
  proc = subprocess.Popen(cmd, env=env, cwd=tmp_path / "tree", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    for _ in range(1200):
      with contextlib.suppress(FileNotFoundError, KeyError, json.JSONDecodeError):
        if json.loads((out / "report.json").read_text())["stages"]["headline"].get("decode"): break
      time.sleep(0.5)
  finally: proc.kill(); proc.wait()
  for _ in range(20):   # the stage's watch sees its parent gone within a second
    time.sleep(1)
    if not (alive := naming(scratch)): break
  assert alive == [], alive
  report = json.loads((out / "report.json").read_text())
  assert report["stages"]["device"]["status"] == "done" and report["stages"]["headline"]["status"] == "running"
  assert report["not_reached"] == ["pair", "kernels"]
  md = (out / "report.md").read_text()
  assert "*headline: running" in md and "a report that ends here was cut" in md
  assert "**Not reached: pair, kernels.**" in md and what_comes_back(out) == []

def naming(folder:pathlib.Path) -> list[str]:
  """The processes whose command line names folder, where /proc lists them (Linux)."""
  alive = []
  for p in pathlib.Path("/proc").glob("[0-9]*"):
    with contextlib.suppress(OSError):
      if str(folder) in (p / "cmdline").read_bytes().decode(errors="replace"): alive.append(p.name)
  return alive

def test_the_profile_predicts_with_the_constants_of_the_gpu_it_is_on():
  """tools/gpu_profile.py's model takes the copy rate and multiprocessors of the GPU nvidia-smi names (an H200's are
  not an H100's); where it names none of its GPUs (no nvidia-smi, another GPU), the H100's, which the report says."""
  import gpu_profile
  try:
    assert gpu_profile.use("NVIDIA H200, 565.57.01, 143771 MiB") == "H200"
    assert (gpu_profile.BANDWIDTH, gpu_profile.SMS) == gpu_profile.GPUS["H200"] != gpu_profile.GPUS["H100"]
    assert gpu_profile.use("NVIDIA H100 80GB HBM3") == "H100" and gpu_profile.use("") == "H100"
    assert (gpu_profile.BANDWIDTH, gpu_profile.SMS) == gpu_profile.GPUS["H100"]
  finally: gpu_profile.use("H100")
