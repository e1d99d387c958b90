"""python spec.py --self-check: it passes on this device, and it fails when a rule is broken."""
import os, subprocess, sys
import pytest
import spec
import self_check
from conftest import INTERPRETER, ROOT

def test_the_self_check_passes_and_says_what_it_checked():
  out = subprocess.run([sys.executable, "spec.py", "--self-check"], cwd=ROOT, capture_output=True, text=True)
  lines = out.stdout.splitlines()
  assert out.returncode == 0, out.stdout + out.stderr[-2000:]
  assert lines[0].startswith("spec self-check on ") and lines[-1].startswith("all checks passed")
  checks = [l for l in lines if l.startswith(("PASS", "FAIL"))]
  assert len(checks) == 26 and all(l.startswith("PASS") for l in checks)
  assert len(lines) == len(checks) + 2, lines                                   # the header, the checks, the summary
  chatter = [l for l in out.stderr.splitlines() if not l.startswith("spec: ")]   # spec's notices of a first run's work
  assert not chatter, chatter[:5]                                                # no compiler's '1 warning generated.'
  for words in ("round enumerated, block rule, one-hot draft", "round enumerated, token rule, sampled draft, T 0.8, top-k 2",
                "float32 edge: uniforms strictly inside", "float32 edge: block rule: h = 1 where w = 1",
                "greedy identity, K 4, token rule, plain", "chi-square's negative control", "chi-square, 300 tokens",
                "massive activations (3000 at position 0 and out of layer 0's MLP), engine"):
    assert any(words in l for l in checks), words

def test_the_self_checks_first_lines_come_without_compiler_chatter():
  """Its header and first checks, each kernel compiled afresh (tinygrad's and pocl's caches off): nothing on stderr but
  spec's own notices, where pocl printed '1 warning generated.' for each kernel (the whole run is the long test above)."""
  env = {**os.environ, "CACHELEVEL": "0", "POCL_KERNEL_CACHE": "0"}
  run = subprocess.Popen([sys.executable, "spec.py", "--self-check"], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  lines = [run.stdout.readline() for _ in range(12)]   # the header, 8 rounds enumerated, 3 float32 edges (the draws)
  run.terminate()
  _, stderr = run.communicate(timeout=120)
  assert lines[0].startswith("spec self-check on ") and all(l.startswith("PASS  round enumerated") for l in lines[1:9])
  assert all(l.startswith("PASS  float32 edge") for l in lines[9:]), lines
  chatter = [l for l in stderr.splitlines() if not l.startswith("spec: ")]
  assert not chatter, chatter[:5]

def failures(monkeypatch, name:str, broken) -> list[str]:
  """The self-check's failing lines with spec's function `name` replaced by broken (stored steps are off in it)."""
  monkeypatch.setattr(spec, name, broken)
  lines = []
  report = lambda what, figure, ok: None if ok else lines.append(what)
  self_check.enumeration_checks(report)
  return lines

@pytest.mark.backend
def test_the_self_check_fails_when_a_rule_is_broken(monkeypatch, tmp_path):
  """The negative controls of the tests, through the self-check: acceptance doubled (the seed's r ~ U[0, 0.5]) fails the
  token rule's enumerations, a block rule without the 1 - w_i term the block rule's, and always accepting fails the
  chi-square test."""
  lenient = lambda p, q, x, acceptance=spec.acceptance: (lambda qx, px: (qx * 2, px))(*acceptance(p, q, x))
  token = failures(monkeypatch, "acceptance", lenient)
  assert token and all("token rule" in l for l in token) and any("one-hot" in l for l in token), token
  monkeypatch.undo()
  def eager(P, Q, drafted, block_acceptance=spec.block_acceptance):
    w, m, slack = block_acceptance(P, Q, drafted)
    return w, m, (spec.Tensor.arange(w.shape[0]) == 0).where(0, 1)
  block = failures(monkeypatch, "block_acceptance", eager)
  assert block and all("block rule" in l for l in block), block
  monkeypatch.undo()
  always = lambda p, q, x, acceptance=spec.acceptance: (lambda qx, px: (qx * 0 + 1, px * 0))(*acceptance(p, q, x))
  monkeypatch.setattr(spec, "acceptance", always)
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  lines = []
  target, draft = (spec.models.load(path, plain=True) for path in self_check.iid_pair(tmp_path))
  self_check.sampling_checks(lambda what, figure, ok: lines.append((what, ok)), target, draft, "plain", rule="token")
  assert [ok for what, ok in lines] == [False, True], lines   # the test rejects; its control still does

@pytest.mark.gpu
def test_the_chi_square_check_passes_and_its_control_fails(tmp_path):
  """The self-check's statistical part alone, on the port: small enough for an interpreted device (the GPU suite),
  which leaves out its negative control, the draft's own tokens: it tests the test, not the device."""
  lines = []
  target, draft = (spec.models.load(path, plain=True) for path in self_check.iid_pair(tmp_path))
  self_check.sampling_checks(lambda what, figure, ok: lines.append((what, figure, ok)), target, draft, "plain",
                             control=not INTERPRETER)
  assert [ok for *_, ok in lines] == [True] * (1 + (not INTERPRETER)) and "chi-square, 300 tokens" in lines[0][0], lines
