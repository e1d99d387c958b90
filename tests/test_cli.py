"""spec.py's command line: --help, --json, --trace, and bad input as one line on stderr with exit code 2."""
import json, os, signal, subprocess, sys
import numpy as np
import pytest
import models, spec
import conftest
from conftest import ROOT, TINY, random_weights, shared_dir, write_checkpoint

def pair() -> list[str]:
  d = shared_dir()
  return ["--target", str(d / "docs-target"), "--draft", str(d / "docs-draft"), "--dtype", conftest.DTYPE, "--search", "0"]

def run(args, capsys) -> tuple[int, str, str]:
  try: code = spec.main(args)
  except SystemExit as e: code = e.code
  out, err = capsys.readouterr()
  return code, out, err

def test_help_explains_every_flag():
  out = subprocess.run([sys.executable, "spec.py", "--help"], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0
  for flag in ("--plain", "--prompt", "--prompt-file", "--target", "--draft", "--lookahead", "--max-new-tokens", "--temperature",
               "--top-k", "--top-p", "--seed", "--ignore-eos", "--compare", "--json", "--trace", "--dummy-weights",
               "--ngram-max", "--ngram-min", "--dtype", "--draft-dtype", "--verify", "--search", "auto"):
    assert flag in out.stdout
  assert "default: gpt2-xl" in out.stdout and "(default: 2)" in out.stdout and "default: block" in out.stdout

@pytest.mark.backend
def test_json_with_compare(capsys):
  code, out, _ = run(pair() + ["--prompt", "A dictionary is", "-n", "12", "--compare", "--json"], capsys)
  assert code == 0
  obj = json.loads(out)
  assert set(obj) >= {"prompt_tokens", "tokens", "text", "stats", "baseline"}
  assert len(obj["tokens"]) == 12 and obj["tokens"] == obj["baseline"]["tokens"]  # greedy: identical
  stats = obj["stats"]
  for key in ("new_tokens", "rounds", "draft_passes", "drafted", "accepted", "acceptance_rate", "r_prime", "tokens_per_s",
              "draft_seconds", "t_draft", "t_target", "theoretical_speedup"):
    assert key in stats, key
  assert list(stats["draft_seconds"]) == ["2"] and stats["t_draft"] == stats["draft_seconds"]["2"] > 0  # K 2 throughout
  assert obj["dtype"] == conftest.DTYPE and obj["draft_dtype"] == models.draft_dtype("auto", models.DTYPES[conftest.DTYPE])

@pytest.mark.backend
def test_plain_generates_what_the_engine_generates(capsys):
  """--plain: the port on tinygrad alone, said in the JSON, and token for token the engine's greedy output."""
  outputs = []
  for plain in ([], ["--plain"]):
    code, out, _ = run(pair() + plain + ["--prompt", "A dictionary is", "-n", "12", "--json"], capsys)
    assert code == 0
    outputs.append(json.loads(out))
  assert [o["plain"] for o in outputs] == [False, True] and outputs[0]["tokens"] == outputs[1]["tokens"]

def test_prompt_lookup_with_auto_lookahead(capsys):
  code, out, _ = run(pair()[:2] + ["--search", "0", "--draft", "ngram", "-K", "auto", "--prompt", "A list is a list. A list is", "-n", "16",
                                   "--compare", "--json"], capsys)
  obj = json.loads(out)
  assert code == 0 and obj["tokens"] == obj["baseline"]["tokens"]
  assert obj["stats"]["draft"] == "ngram" and obj["stats"]["K"] == "auto" and obj["stats"]["draft_passes"] == 0
  assert sum(obj["stats"]["lookaheads"].values()) == obj["stats"]["rounds"]

@pytest.mark.backend
def test_trace_lines(tmp_path, capsys):
  trace = tmp_path / "trace.jsonl"
  trace.write_text("an earlier run's trace\n" * 20)   # replaced
  code, _, _ = run(pair() + ["--prompt", "The standard library", "-n", "10", "--temperature", "1", "--trace", str(trace)], capsys)
  lines = [json.loads(l) for l in trace.read_text().splitlines()]
  assert code == 0 and len(lines) == 10
  for e in lines:
    assert set(e) == {"id", "text", "source", "index", "q", "p"} and e["source"] in ("accepted", "resampled", "bonus")
    assert 0 < e["q"] <= 1 and (e["p"] is None) == (e["source"] == "bonus")

def streaming(n:int) -> subprocess.Popen:
  """spec.py generating n tokens of the shared pair as text into a pipe, once its first bytes have arrived, with Ctrl-C's
  signal as a terminal's foreground run has it: a suite started in the background by a script inherits it ignored, and
  Python then never raises KeyboardInterrupt."""
  proc = subprocess.Popen([sys.executable, "spec.py", *pair(), "--prompt", "The Python interpreter", "-n", str(n), "--ignore-eos"],
                          cwd=ROOT, env={**os.environ, "NO_COLOR": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  assert proc.stdout.read(30).startswith(b"-" * 20)
  return proc

def test_a_reader_that_goes_away_ends_the_run_without_a_traceback():
  # spec.py | head: the text streams token by token, and the write after head exits raises BrokenPipeError
  proc = streaming(200)
  proc.stdout.close()
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=300) == 1 and "Traceback" not in err and "BrokenPipeError" not in err, err

def test_ctrl_c_ends_the_run_with_130_without_a_traceback():
  # a run that ended before the signal (a busy machine: CI's test processes beside it) proves nothing: run again
  for _ in range(3):
    if (proc := streaming(500)).poll() is None: break
  assert proc.poll() is None, "every run ended before the test could interrupt it"
  proc.send_signal(signal.SIGINT)
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=300) == 130 and "Traceback" not in err, err

@pytest.mark.parametrize("args,words", [
  (["-K", "0"], "K (lookahead) must be >= 1"),
  (["-n", "0"], "max new tokens must be >= 1"),
  (["--temperature", "-1"], "temperature must be in [0, 3.4e38]"),
  (["--temperature", "inf"], "temperature must be in [0, 3.4e38]"),   # -inf padding / inf is NaN: token 0 every time
  (["--temperature", "1e39"], "temperature must be in [0, 3.4e38]"),  # inf in float32
  (["--seed", "-1"], "seed must be in [0, 2**64)"),                   # would share 2**64 - 1's key
  (["--seed", str(2**64)], "seed must be in [0, 2**64)"),             # would share 0's
  (["--trace", "./no/such/dir/trace.jsonl"], "No such file or directory"),
  (["--top-k", "-3"], "top-k must be >= 0"),
  (["--top-p", "0"], "top-p must be in (0, 1]"),
  (["--top-p", "1.5"], "top-p must be in (0, 1]"),
  (["-K", "four"], "invalid lookahead 'four'"),
  (["--draft", "ngram", "--ngram-min", "0"], "need 1 <= ngram-min <= ngram-max"),
  (["--draft", "ngram", "--ngram-max", "2", "--ngram-min", "3"], "need 1 <= ngram-min <= ngram-max"),
  (["--target", "gpt5"], "unknown model 'gpt5'"),
  (["--target", "./no/such/dir"], "no such checkpoint directory"),
  (["--dtype", "bfloat16"], "argument --dtype: invalid choice: 'bfloat16'"),
  (["--draft-dtype", "bfloat16"], "argument --draft-dtype: invalid choice: 'bfloat16'"),
  (["--verify", "tree"], "argument --verify: invalid choice: 'tree'"),
  (["--search", "-1"], "search must be >= 0"),
  (["--plain", "--search", "1"], "--search is the engine's kernel search: drop --plain to use it"),
])
@pytest.mark.quick
def test_bad_input_one_line_exit_2(args, words, capsys):
  code, _, err = run(["--prompt", "x"] + args, capsys)
  assert code == 2 and err.count("\n") == 1 and words in err, err

def test_a_failed_start_leaves_the_trace_file_as_it_was(tmp_path, capsys):
  old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
  old.write_text("an earlier run's trace\n")
  for trace in (old, new):
    code, _, err = run(["--prompt", "x", "--target", "gpt5", "--trace", str(trace)], capsys)
    assert code == 2 and "unknown model 'gpt5'" in err, err
  assert old.read_text() == "an earlier run's trace\n" and not new.exists()

def test_prompt_files(tmp_path, capsys):
  (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
  code, _, err = run(["--prompt-file", str(tmp_path / "latin1.txt")], capsys)
  assert code == 2 and err.count("\n") == 1 and f"prompt file {tmp_path / 'latin1.txt'} is not UTF-8 text (byte 3" in err, err
  code, _, err = run(["--prompt-file", str(tmp_path / "missing.txt")], capsys)
  assert code == 2 and err.count("\n") == 1 and "No such file or directory" in err and "missing.txt" in err, err
  (tmp_path / "utf8.txt").write_text("The café's menu", encoding="utf-8")
  assert spec.read_prompt(str(tmp_path / "utf8.txt")) == "The café's menu"

def test_prompt_too_long(capsys):
  code, _, err = run(pair() + ["--prompt", "word " * 600], capsys)
  assert code == 2 and err.count("\n") == 1 and "exceeds the context of 512" in err

def test_different_vocabularies(tmp_path, capsys):
  small = dict(TINY, vocab_size=50)
  draft = write_checkpoint(tmp_path / "small", small, random_weights(small, seed=1))
  code, _, err = run(pair()[:2] + ["--draft", str(draft), "--prompt", "x"], capsys)
  assert code == 2 and err.count("\n") == 1 and "vocabularies differ" in err

@pytest.mark.quick
def test_bad_input_from_a_real_process_has_no_traceback():
  out = subprocess.run([sys.executable, "spec.py", "--top-p", "2"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "NO_COLOR": "1"})
  assert out.returncode == 2 and out.stderr.strip() == "spec.py: error: top-p must be in (0, 1], got 2.0"

def test_prompt_outside_the_vocabulary(tmp_path, capsys):
  ckpt = str(write_checkpoint(tmp_path / "tiny", TINY, random_weights(TINY, seed=1)))   # 64 tokens; "x" is GPT-2's 87
  code, _, err = run(["--target", ckpt, "--draft", ckpt, "--prompt", "x"], capsys)
  assert code == 2 and err.count("\n") == 1 and "outside the models' vocabulary of 64" in err

@pytest.mark.backend
def test_dummy_weights_say_so(tmp_path, capsys):
  # a config.json is all --dummy-weights reads: one small layer over GPT-2's first 64 tokens ("A" is token 32)
  write_checkpoint(tmp_path / "small", dict(TINY, n_layer=1), {})
  ckpt = str(tmp_path / "small")
  code, out, err = run(["--target", ckpt, "--draft", ckpt, "--dtype", conftest.DTYPE, "--search", "0", "--dummy-weights", "--prompt",
                        "A", "-n", "4", "--json"], capsys)
  obj = json.loads(out)
  assert code == 0 and obj["dummy_weights"] is True and len(obj["tokens"]) == 4 and "random weights" in err

def test_dummy_weights_are_random_with_the_checkpoints_shapes(tmp_path):
  ckpt = write_checkpoint(tmp_path / "tiny", TINY, random_weights(TINY, seed=1))
  real, dummy = models.load(str(ckpt)), models.load(str(ckpt), dummy=True)
  w, d = real.h[0].mlp.c_fc.weight.numpy(), dummy.h[0].mlp.c_fc.weight.numpy()
  assert w.shape == d.shape and not np.allclose(w, d) and abs(d.std() - 0.02) < 0.002

def bare_environment(tmp_path, **env) -> dict:
  """This environment with an empty PATH (no clang, no linker), no compiler named by CC and no OpenCL drivers: a fresh
  machine without them."""
  (tmp_path / "no-icd").mkdir(exist_ok=True)
  base = {k: v for k, v in os.environ.items() if k != "CC"}
  return {**base, "PATH": str(tmp_path), "OCL_ICD_VENDORS": str(tmp_path / "no-icd"), "NO_COLOR": "1", **env}

@pytest.mark.parametrize("dev,words", [("CPU", "No such file or directory: 'clang'"), ("NOSUCH", "ops_nosuch"), ("", "DEV unset")])
def test_no_usable_device_is_one_line(tmp_path, dev, words):
  if not dev:   # a GPU machine: its backend needs no compiler on PATH, and DEV unset picks it
    probe = "import models; from tinygrad import Device; models.check_device(); print(Device.DEFAULT)"
    found = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                           env=bare_environment(tmp_path, DEV=""))
    if found.returncode == 0: pytest.skip(f"{found.stdout.strip()} runs without a compiler on PATH: not a bare machine")
  out = subprocess.run([sys.executable, "spec.py", "--prompt", "x"], cwd=ROOT, capture_output=True, text=True,
                       env=bare_environment(tmp_path, DEV=dev))
  assert out.returncode == 2 and out.stderr.count("\n") == 1 and words in out.stderr, out.stderr
  assert out.stderr.startswith("spec.py: error: no usable tinygrad device") and "apt-get install clang" in out.stderr
