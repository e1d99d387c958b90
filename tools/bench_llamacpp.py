#!/usr/bin/env python3
"""Optional benchmark step: spec against llama.cpp's decoding of the same checkpoints on the same CPU, one run each,
greedy, the trained pair docs-deep/docs-draft, in float32 and float16. Not a dependency of spec.py or the tests.
llama.cpp as pip's llama-cpp-python source package carries it (offline once downloaded), or a checkout:

  pip download --no-binary :all: --no-deps llama-cpp-python && tar xzf llama_cpp_python-*.tar.gz
  L=$(echo llama_cpp_python-*/vendor/llama.cpp) && cmake -S $L -B $L/build -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
    && cmake --build $L/build -j --target llama-bench llama-completion llama-speculative llama-quantize
  pip install sentencepiece pyyaml                      # what llama.cpp's gguf-py imports
  python3 tools/bench_llamacpp.py --llama-cpp $L         # about 10 minutes

The checkpoints become float32 GGUF files (llama.cpp's gguf-py writes them; the tokenizer is GPT-2's, from tiktoken's
r50k_base: its tokens and the merges that rebuild them), both also float16 (llama-quantize F16). Then, on every core:
llama-bench's plain decoding of the target in F32 and F16 (tg, 128 tokens after none), and each prompt in turn by
llama.cpp's greedy decoding in F32 and F16 (llama-completion; llama-cli where an older build has no llama-completion),
llama-speculative's (the draft, at most 2 and 4 drafted tokens: --spec-draft-n-max, or --draft-max in older builds, its
other settings its defaults; F32, K 2 also beside an F16 draft, as spec's default, and F16), spec's target alone and
spec's speculative sampling with default flags (the draft's dtype --draft-dtype auto's) in float32 and
float16 (after a warm-up on every prompt), each in ms a token of its own timers (spec: Stats.time_total, the rounds).
The memory's read rate (numpy's BLAS matrix-vector product) is measured before and after, and beside each prompt's
runs of spec: the target alone is given against its weights' bytes at the rate beside each run (the memory floor),
speculative sampling against llama.cpp's plain decoding (llama-completion) in the same dtype. The first prompt's
greedy text is compared, a check of the conversion: the same weights and tokenizer, the same text. --xl DIR adds a
gpt2-xl checkpoint's one-token decode in three rounds, each llama-bench's in F32 and F16, then spec's in float32 and
float16 beside the memory floor (about 10 minutes more; self_check.random_gpt2() and write_checkpoint() make a random
one where none is at hand).
"""
import argparse, json, math, os, pathlib, re, subprocess, sys, tempfile, time
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "models"
if (SHARED / "tiktoken").is_dir(): os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED / "tiktoken")
import numpy as np
from tinygrad.nn.state import safe_load
import models, spec
import benchmark
from benchmark import PROMPTS, bandwidth
from models.timing import best_seconds

BLOCK = (("ln_1", "attn_norm"), ("attn.c_attn", "attn_qkv"), ("attn.c_proj", "attn_output"), ("ln_2", "ffn_norm"),
         ("mlp.c_fc", "ffn_up"), ("mlp.c_proj", "ffn_down"))

def gpt2_vocab() -> tuple[list[str], list[str]]:
  """GPT-2's tokens as byte-level BPE strings (its bytes-to-unicode map), <|endoftext|> last, and the merges that make
  each token of two or more bytes from its two parts."""
  enc = models.tokenizer()
  ranks = enc._mergeable_ranks
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  unicode = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(b for b in range(256)
                                                                                   if b not in printable)}
  text = lambda bs: "".join(unicode[b] for b in bs)
  def split(token:bytes) -> list[bytes]:
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:   # BPE's merges in rank order end in the two parts the token's own merge joins
      i = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], math.inf))
      parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts
  ordered = sorted(ranks, key=ranks.get)
  merges = [" ".join(map(text, split(t))) for t in ordered if len(t) > 1]
  return [text(t) for t in ordered] + ["<|endoftext|>"], merges

def to_gguf(gguf, checkpoint:pathlib.Path, out:pathlib.Path, vocab) -> pathlib.Path:
  """A Hugging Face GPT-2 checkpoint as a float32 GGUF file in llama.cpp's names (Conv1D weights transposed, the
  lm_head tied to wte)."""
  cfg = json.loads((checkpoint / "config.json").read_text())
  state = {k: v.numpy() for k, v in safe_load(str(checkpoint / "model.safetensors")).items()}
  w = gguf.GGUFWriter(str(out), "gpt2")
  w.add_block_count(cfg["n_layer"]); w.add_context_length(cfg["n_positions"]); w.add_embedding_length(cfg["n_embd"])
  w.add_feed_forward_length(4 * cfg["n_embd"]); w.add_head_count(cfg["n_head"])
  w.add_layer_norm_eps(cfg.get("layer_norm_epsilon", 1e-5)); w.add_file_type(gguf.LlamaFileType.ALL_F32)
  tokens, merges = vocab
  w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("gpt-2"); w.add_token_list(tokens)
  w.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 1) + [gguf.TokenType.CONTROL]); w.add_token_merges(merges)
  w.add_bos_token_id(models.EOT); w.add_eos_token_id(models.EOT)
  w.add_tensor("token_embd.weight", state["wte.weight"]); w.add_tensor("position_embd.weight", state["wpe.weight"])
  for i in range(cfg["n_layer"]):
    for ours, theirs in BLOCK:
      weight = state[f"h.{i}.{ours}.weight"]
      w.add_tensor(f"blk.{i}.{theirs}.weight", np.ascontiguousarray(weight.T) if weight.ndim == 2 else weight)
      w.add_tensor(f"blk.{i}.{theirs}.bias", state[f"h.{i}.{ours}.bias"])
  w.add_tensor("output_norm.weight", state["ln_f.weight"]); w.add_tensor("output_norm.bias", state["ln_f.bias"])
  w.add_tensor("output.weight", state["wte.weight"])
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  return out

def run(cmd:list, check:bool=True) -> str:
  out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)
  if check and out.returncode: sys.exit(f"{cmd[0]} failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
  return out.stdout + out.stderr

def tool(bin_:pathlib.Path, *names:str) -> pathlib.Path:
  """The first of these llama.cpp programs the build has (llama-completion took llama-cli's plain completion)."""
  for name in names:
    if (bin_ / name).is_file(): return bin_ / name
  sys.exit(f"{bin_}: none of {', '.join(names)} is built")

def draft_flags(speculative:pathlib.Path) -> tuple[str, str]:
  """The flags of this build of llama-speculative for the most and the fewest drafted tokens a round."""
  new = "--spec-draft-n-max" in run([speculative, "--help"], check=False)
  return ("--spec-draft-n-max", "--spec-draft-n-min") if new else ("--draft-max", "--draft-min")

def eval_ms(log:str) -> tuple[float, int]:
  """llama.cpp's eval timer: (milliseconds, tokens) of the generated tokens after the prompt."""
  ms, n = re.search(r"print:\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs", log).groups()   # not "prompt eval"
  return float(ms), int(n)

def speculative_ms(log:str) -> tuple[float, int]:
  """llama-speculative's own count: (milliseconds, tokens) decoded after the prompt."""
  n, seconds = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log).groups()
  return 1e3 * float(seconds), int(n)

def memory_rate() -> float:
  """numpy's BLAS matrix-vector product's read rate, bytes/s."""
  return bandwidth()['numpy BLAS matvec']

def rate_now(matvec, nbytes:int) -> float:
  """The read rate of benchmark.blas_matvec()'s call now (the best of 3), once its threads stopped spinning."""
  seconds = best_seconds(matvec, 3)
  time.sleep(benchmark.SETTLE)
  return nbytes / seconds

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--llama-cpp", required=True, type=pathlib.Path, help="a llama.cpp source tree built with cmake "
                  "(build/bin/llama-bench, llama-completion or llama-cli, llama-speculative, llama-quantize; gguf-py)")
  ap.add_argument("-n", type=int, default=128, help="new tokens a prompt")
  ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the benchmark's prompts")
  ap.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp's threads (spec: its own, every core)")
  ap.add_argument("--xl", type=pathlib.Path, help="also this gpt2-xl checkpoint directory (config.json + "
                  "model.safetensors): llama-bench's decoding in F32 and F16 beside spec's decode in both dtypes")
  args = ap.parse_args()
  sys.path.insert(0, str(args.llama_cpp / "gguf-py"))
  import gguf
  bin_ = args.llama_cpp / "build" / "bin"
  completion, speculative = tool(bin_, "llama-completion", "llama-cli"), tool(bin_, "llama-speculative")
  plain_flags = ["-no-cnv"] if "-no-cnv" in run([completion, "--help"], check=False) else []
  prompts, enc = PROMPTS[:args.prompts], models.tokenizer()
  rate_before = memory_rate()
  # what each of spec's runs is given against: the target alone its weights' bytes (the memory floor), speculative
  # sampling llama.cpp's plain decoding in the same dtype
  ours, weight_bytes, llama_dtype = {}, {}, {}
  for dtype, f in (("float32", "F32"), ("float16", "F16")):
    target_model = models.load(str(SHARED / "docs-deep"), dtype)
    draft_dtype = models.draft_dtype("auto", target_model.dtype)   # as spec.py's --draft-dtype auto
    draft_model = models.load(str(SHARED / "docs-draft"), draft_dtype)
    alone = f"spec, target alone, {dtype}"
    both = f"spec, speculative sampling (default flags), {dtype}, draft {draft_dtype}"
    weight_bytes[alone], llama_dtype[both] = benchmark.sizes(target_model)[0], f
    ours[alone] = lambda p, n, t=target_model: spec.autoregressive_generate(t, p, n, eos=None)
    ours[both] = lambda p, n, t=target_model, d=draft_model: \
      spec.speculative_generate(t, d, p, max_new_tokens=n, eos=None)
  for fn in ours.values():
    for p in prompts: fn(enc.encode(p), 4)                          # warm-up: the steps, every prefill width
  with tempfile.TemporaryDirectory() as tmp:
    vocab = gpt2_vocab()
    target, draft = (to_gguf(gguf, SHARED / d, pathlib.Path(tmp) / f"{d}.gguf", vocab)
                     for d in ("docs-deep", "docs-draft"))
    target16, draft16 = (pathlib.Path(tmp) / f"{d}-f16.gguf" for d in ("docs-deep", "docs-draft"))
    for f32, f16 in ((target, target16), (draft, draft16)): run([tool(bin_, "llama-quantize"), f32, f16, "F16"])
    bench = {f: json.loads(run([tool(bin_, "llama-bench"), "-m", m, "-p", 0, "-n", args.n, "-t", args.threads, "-r", 5,
                                "-o", "json"]))[0] for f, m in (("F32", target), ("F16", target16))}
    print(f"# spec against llama.cpp {bench['F32'].get('build_commit', '?')}: docs-deep / docs-draft, {args.threads} "
          f"threads, greedy, {len(prompts)} prompts x {args.n} tokens\n")
    common = ["-n", args.n, "-t", args.threads, "--temp", 0, "--ignore-eos"]
    llama = {f"llama.cpp, {completion.name} greedy decoding, {f}": lambda p, m=m: eval_ms(run(
      [completion, "-m", m, "-p", p, *plain_flags, *common])) for f, m in (("F32", target), ("F16", target16))}
    most, fewest = draft_flags(speculative)
    for K, f, m, d in ((2, "F32", target, draft), (4, "F32", target, draft), (2, "F32, draft F16", target, draft16),
                       (2, "F16", target16, draft16)):
      llama[f"llama.cpp, llama-speculative (K {K}), {f}"] = lambda p, K=K, m=m, d=d: speculative_ms(run(
        [speculative, "-m", m, "-md", d, "-p", p, most, K, fewest, 0, *common]))
    # each prompt by every run in turn: a shared machine's memory rate moves over minutes, the comparison should not;
    # the floor's rate measured beside each prompt's runs of spec: it moves within a run (docs/measurements.md)
    totals, floor_ms, rates = {name: [0.0, 0] for name in [*llama, *ours]}, {name: 0.0 for name in weight_bytes}, []
    matvec = benchmark.blas_matvec()
    for p in prompts:
      for name, fn in llama.items():
        ms, n = fn(p)
        totals[name][0] += ms; totals[name][1] += n
      rates.append(rate := rate_now(*matvec))
      for name, fn in ours.items():
        stats = fn(enc.encode(p), args.n)[1]
        totals[name][0] += 1e3 * stats.time_total; totals[name][1] += stats.new_tokens
        if name in weight_bytes: floor_ms[name] += 1e3 * stats.new_tokens * weight_bytes[name] / rate
    text = run([completion, "-m", target, "-p", prompts[0], *plain_flags, *common[:-1]])
  first = enc.decode(ours["spec, target alone, float32"](enc.encode(prompts[0]), 32)[0])
  rate_after = memory_rate()
  print(f"memory (numpy's BLAS matrix-vector product): {rate_before / 1e9:.1f} GB/s before, {rate_after / 1e9:.1f} "
        f"after, {min(rates) / 1e9:.1f}-{max(rates) / 1e9:.1f} beside each prompt's runs of spec\n")
  print("| run | ms a token | against |\n|---|---|---|")
  for f, b in bench.items():
    print(f"| llama.cpp, llama-bench decoding, {f} (tg, no prompt, before the rest) | {1e3 / b['avg_ts']:.2f} | |")
  plain = {f: totals[f"llama.cpp, {completion.name} greedy decoding, {f}"] for f in ("F32", "F16")}
  for name, (ms, n) in totals.items():
    if name in weight_bytes: against = f"{ms / floor_ms[name]:.2f}x the memory floor"
    elif f := llama_dtype.get(name): against = f"{plain[f][0] / plain[f][1] / (ms / n):.2f}x llama.cpp's {f} decoding"
    else: against = ""
    print(f"| {name} | {ms / n:.2f} | {against} |")
  same = first.strip()[:60] in text
  print(f"\nthe first prompt's greedy text (32 tokens, spec's target alone) {'is' if same else 'is NOT'} llama.cpp's")
  if args.xl: print("\n" + "\n".join(xl_decodes(gguf, bin_, args.xl, vocab, args.threads)))

XL_ROUNDS = 3   # the large checkpoint's rounds: llama-bench, then spec beside numpy's matvec, in turn

def xl_decodes(gguf, bin_:pathlib.Path, checkpoint:pathlib.Path, vocab, threads:int) -> list[str]:
  """Table rows: a large checkpoint's one-token decode in XL_ROUNDS rounds, in each llama-bench's (tg 32 after none,
  best of 3) in F32 and F16, then spec's step in float32 and float16 timed side by side with numpy's BLAS
  matrix-vector product (the memory floor's rate): each against its weights' bytes at that rate, and spec against
  llama.cpp in the same dtype a few seconds apart (the memory's rate moves by 1.5x within minutes)."""
  ours = {dt: models.load(str(checkpoint), dt) for dt in ("float32", "float16")}
  rows = [f"{checkpoint.name}'s decode, ms a token (x its weights' bytes at numpy's rate); spec against llama-bench in "
          "the same dtype:\n", "| round | numpy's BLAS matvec | llama-bench F32 | llama-bench F16 | spec float32 | "
          "spec float16 | spec / llama.cpp, float32 | float16 |", "|---|---|---|---|---|---|---|---|"]
  with tempfile.TemporaryDirectory() as tmp:
    f32 = to_gguf(gguf, checkpoint, pathlib.Path(tmp) / "xl.gguf", vocab)
    f16 = pathlib.Path(tmp) / "xl-f16.gguf"
    run([tool(bin_, "llama-quantize"), f32, f16, "F16"])
    ggufs = {"float32": f32, "float16": f16}
    bench = [tool(bin_, "llama-bench"), "-p", 0, "-n", 32, "-t", threads, "-r", 3, "-o", "json"]
    for i in range(XL_ROUNDS):
      llama = {dt: 1 / max(json.loads(run(bench + ["-m", m]))[0]["samples_ts"]) for dt, m in ggufs.items()}
      decodes = benchmark.decodes_and_floor(ours)
      seconds, nbytes = decodes.pop("numpy BLAS matvec")
      rate = nbytes / seconds
      floor = {dt: llama[dt] / (b / rate) for dt, (_, b) in decodes.items()}
      rows.append(f"| {i + 1} | {rate / 1e9:.1f} GB/s | " +
                  " | ".join(f"{llama[dt] * 1e3:.2f} ({floor[dt]:.2f}x)" for dt in ggufs) + " | " +
                  " | ".join(f"{t * 1e3:.2f} ({t / (b / rate):.2f}x)" for t, b in decodes.values()) + " | " +
                  " | ".join(f"{decodes[dt][0] / llama[dt]:.2f}x" for dt in ggufs) + " |")
  return rows

if __name__ == "__main__":
  main()
