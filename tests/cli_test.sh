#!/usr/bin/env bash
# End-to-end checks of the scalify CLI as a user runs it.
set -euo pipefail
cli="$(realpath "$1")"  # absolute: some checks run from another folder
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

"$cli" --help | grep -q "formats"
"$cli" formats | grep -E "^e4m3 +8 +4 +3 +7 +448 " > /dev/null
"$cli" formats --csv | grep -q "^e5m2,8,5,2,15,57344,"

"$cli" snr --out "$out" --from -4 --to 4 --step 1 --samples 4096 --formats e4m3,fp8_e5m2 > "$out/log"
grep -q "INT8 scaled so 180 -> 127" "$out/log"
test "$(grep -c ',e4m3,' "$out/snr.csv")" -eq 9
test -s "$out/snr.png" || { echo "no plot written"; exit 1; }

# Unit-scaling factors: estimated values within 1 % of Table A.2.
"$cli" unit-factors --samples 200000 > "$out/factors"
grep -E "^gelu +1\.70[0-9]+ +1\.7010" "$out/factors" > /dev/null
test "$(grep -c '%' "$out/factors")" -eq 4
"$cli" scale-rules | grep -q "^| matmul |"

# info: the chosen paths follow the environment switches CI uses for the second pass.
"$cli" info > "$out/info"
for key in "scalify:" "cpu:" "cpu features:" "format kernels:" "gemm fp8 codes:" "threads:"; do
  grep -q "^$key" "$out/info" || { echo "info lacks $key"; exit 1; }
done
SCALIFY_ISA=scalar SCALIFY_GEMM=f32 "$cli" info > "$out/info_limited"
grep -q "^format kernels: scalar$" "$out/info_limited"
grep -q "^gemm fp8 codes: f32" "$out/info_limited"
if SCALIFY_GEMM=fp4 "$cli" info 2> "$out/err"; then echo "accepted SCALIFY_GEMM=fp4"; exit 1; fi
grep -q "SCALIFY_GEMM='fp4'" "$out/err"

# Bad input: an unknown format is a clear error naming it and listing the valid ones.
if "$cli" snr --out "$out" --formats e4m4 2> "$out/err"; then echo "accepted e4m4"; exit 1; fi
grep -q "unknown number format 'e4m4'" "$out/err"
grep -q "e5m2fnuz" "$out/err"
# compare: a tiny comparison end to end (f32 is added as the baseline), then bad input.
"$cli" compare --recipes current --steps 3 --out "$out/cmp" --set d_model=16 --set layers=1 --set heads=1 \
  --set seq=16 --set batch=2 --set eval_every=3 --set eval_windows=2 --set stats_every=1 > "$out/cmp.log" 2> /dev/null
grep -q "^| f32 | ok |" "$out/cmp.log"
grep -q "^| current | ok |" "$out/cmp.log"
grep -q "report: $out/cmp/report.md" "$out/cmp.log"
for png in delta loss_delta loss; do test -s "$out/cmp/$png.png" || { echo "compare wrote no $png.png"; exit 1; }; done
# Two seeds: a run folder per recipe and seed, and the interval's seed part in the table.
"$cli" compare --recipes current --steps 2 --seeds 2 --speed-rounds 1 --out "$out/cmp_seeds" --set d_model=16 --set layers=1 \
  --set heads=1 --set seq=16 --set batch=2 --set eval_windows=4 > "$out/cmp_seeds.log" 2> /dev/null
test -d "$out/cmp_seeds/runs/current_seed2" || { echo "no run folder for seed 2"; exit 1; }
grep -q "^| current | ok | [0-9.]* | [+-][0-9.]* ± [0-9.]* | ± [0-9.]* / ± [0-9.]* |" "$out/cmp_seeds.log" || { cat "$out/cmp_seeds.log"; exit 1; }
if "$cli" compare --recipes f32,fp9 --out "$out/cmp2" 2> "$out/err"; then echo "accepted fp9"; exit 1; fi
grep -q "recipe 'fp9'" "$out/err"
test ! -e "$out/cmp2" || { echo "a bad recipe list left a folder"; exit 1; }
if "$cli" compare --resume "$out/none" 2> "$out/err"; then echo "resumed nothing"; exit 1; fi
grep -q "holds no comparison" "$out/err"
if "$cli" compare --resume "$out/cmp" --steps 5 2> "$out/err"; then echo "resume took --steps"; exit 1; fi
grep -q "drop --steps" "$out/err"
if "$cli" compare --recipes current --out "$out/cmp" 2> "$out/err"; then echo "overwrote a comparison"; exit 1; fi
grep -q "already holds a comparison" "$out/err"
# sweep: 2 widths x 2 learning rates end to end, a rerun that trains nothing, then bad input.
sweep_args=(sweep --vary lr=2^-6:2^-5 --widths 16,32 --steps 10 --out "$out/sweep" --set d_model=16 --set layers=1 --set heads=1
  --set seq=16 --set batch=2 --set eval_every=10 --set eval_windows=2 --set stats_every=5)
"$cli" "${sweep_args[@]}" > "$out/sweep.log" 2> "$out/sweep.err"
grep -q "^\[4/4\] f32 w32_d1 lr=2^-5: val loss [0-9.]*$" "$out/sweep.err" || { cat "$out/sweep.err"; exit 1; }
grep -q "^| 32 | 1 |" "$out/sweep.log"
grep -q "^across widths: \(transfers\|moves by [0-9]* steps\)" "$out/sweep.log"
test -s "$out/sweep/f32_widths.png" || { echo "sweep wrote no f32_widths.png"; exit 1; }
before="$(stat -c %y "$out/sweep/runs/f32/w16_d1/lr=2^-6/model.safetensors")"
"$cli" "${sweep_args[@]}" > "$out/sweep2.log" 2> /dev/null
test "$(stat -c %y "$out/sweep/runs/f32/w16_d1/lr=2^-6/model.safetensors")" = "$before" || { echo "a rerun of the sweep trained again"; exit 1; }
cmp -s "$out/sweep.log" "$out/sweep2.log" || { echo "a rerun of the sweep reported other losses"; exit 1; }
if "$cli" sweep --vary lr=1e-3,2e-3 --widths 24 --out "$out/sweep_bad" --set d_model=16 --set heads=1 2> "$out/err"; then echo "accepted width 24 with head dimension 16"; exit 1; fi
grep -q "width 24 is not a multiple of the head dimension 16" "$out/err"
test ! -e "$out/sweep_bad" || { echo "a refused sweep left a folder"; exit 1; }
# Hardening (issue 13). A hostile --out is a folder name, never shell text.
(cd "$out" && "$cli" snr --out "$out/a';touch INJECTED;'" --from 0 --to 1 --samples 64 --formats e4m3 > /dev/null 2>&1)
test -z "$(find "$out" -name INJECTED)" || { echo "--out ran a shell command"; exit 1; }
test -s "$out/a';touch INJECTED;'/snr.csv"
# Unbounded or non-finite sweeps are clear errors naming the option, not hangs.
expect_error() {  # expect_error TEXT ARGS...: scalify fails (not a crash) and stderr contains TEXT
  local text="$1"; shift
  if timeout 20 "$cli" "$@" > /dev/null 2> "$out/err"; then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$text" "$out/err" || { echo "for '$*' expected '$text', got:"; cat "$out/err"; exit 1; }
  if grep -q "internal error" "$out/err"; then echo "internal error for $*"; exit 1; fi
}
expect_error "--to: must be a finite decimal number, got 'inf'" snr --out "$out/s" --to inf
expect_error "--from: must be a finite decimal number, got '-inf'" snr --out "$out/s" --from -inf
expect_error "--from: must be a finite decimal number, got '1e400'" snr --out "$out/s" --from 1e400
expect_error "--from: must be a finite decimal number, got 'nan'" snr --out "$out/s" --from nan
expect_error "exceeds 10000 points" snr --out "$out/s" --step 1e-9
expect_error "in [-149, 127]" snr --out "$out/s" --from 1e17 --to 1.00000000000001e17 --step 1
expect_error "samples must be in [1, 16777216]" snr --out "$out/s" --samples 268435456
expect_error "step must be a finite number > 0, got 0" snr --out "$out/s" --step 0
if grep -q "1797693" "$out/err"; then echo "--step 0 printed DBL_MAX"; exit 1; fi
expect_error "--seed: must be a decimal integer in [0, 2^64), got '-1'" snr --out "$out/s" --seed -1
touch "$out/plain_file"
expect_error "--out '$out/plain_file' exists and is not a folder" snr --out "$out/plain_file" --from 0 --to 1 --samples 64
expect_error "unknown subcommand 'foo'" foo
test ! -e "$out/s" || { echo "a rejected sweep created its output folder"; exit 1; }
# inspect and quantize (issue 16) on the comparison's tiny runs.
"$cli" inspect "$out/cmp/runs/current" > "$out/insp.log"
grep -q "tensors of recipe current at step 3 against e4m3" "$out/insp.log"
test -s "$out/cmp/runs/current/inspect/histograms.png" || { echo "inspect drew no histograms"; exit 1; }
test -s "$out/cmp/runs/current/inspect/scales.png" || { echo "inspect drew no scale history"; exit 1; }
"$cli" quantize "$out/cmp/runs/f32" --out "$out/q.safetensors" | grep -q "wrote $out/q.safetensors: 4 linear weights in e4m3 (amax)"
"$cli" eval "$out/q.safetensors" | grep -q "^validation loss: "
"$cli" quantize "$out/cmp/runs/f32" --out "$out/q5.safetensors" --format e5m2 | grep -q "4 linear weights in e5m2 (amax)"
"$cli" eval "$out/q5.safetensors" | grep -q "^validation loss: "
"$cli" eval "$out/q.safetensors" --json | grep -Eq '^\{"val_loss": [0-9.e+-]+, "val_bpb": [0-9.e+-]+, "windows": [0-9]+\}$' \
  || { echo "eval --json is not one JSON object"; exit 1; }
"$cli" quantize "$out/cmp/runs/f32" --sweep -2:2 | grep -q "^| fp8_cscale | 2 | "
expect_error "unknown quantisation method 'int4'" quantize "$out/cmp/runs/f32" --out "$out/q2.safetensors" --method int4
expect_error "--sweep takes LO:HI" quantize "$out/cmp/runs/f32" --sweep 3
expect_error "--out FILE.safetensors is required" quantize "$out/cmp/runs/f32"
expect_error "multiple of 32" quantize "$out/cmp/runs/f32" --out "$out/q3.safetensors" --method mx
expect_error "unknown number format 'e4m4'" inspect "$out/cmp/runs/f32" --format e4m4
expect_error "'$out/nothing' does not exist" inspect "$out/nothing"
expect_error "is a quantised checkpoint" inspect "$out/q.safetensors"
expect_error "--out '$out/plain_file' exists and is not a folder" inspect "$out/cmp/runs/f32" --out "$out/plain_file"
expect_error "--out '$out/plain_file' exists and is not a folder" quantize "$out/cmp/runs/f32" --sweep 0:1 --out "$out/plain_file"
expect_error "'$out/plain_file' exists and is not a folder" train --out "$out/plain_file" --steps 1
expect_error "'$out/plain_file' exists and is not a folder" compare --out "$out/plain_file" --recipes f32 --steps 1
expect_error "--sweep HI takes a whole number in [-64, 64], got '99999999999'" quantize "$out/cmp/runs/f32" --sweep 0:99999999999
expect_error "--sweep LO takes a whole number in [-64, 64], got ''" quantize "$out/cmp/runs/f32" --sweep :3
expect_error "--bias takes a whole number in [-64, 64], got ''" quantize "$out/cmp/runs/f32" --out "$out/q2.safetensors" --method cscale --bias ""
expect_error "--bias applies to --method cscale only" quantize "$out/cmp/runs/f32" --out "$out/q2.safetensors" --bias 3
expect_error "it takes neither --method, --format, --bias nor --weights-only" quantize "$out/cmp/runs/f32" --sweep 0:1 --method mx
expect_error "it takes neither --method, --format, --bias nor --weights-only" quantize "$out/cmp/runs/f32" --sweep 0:1 --weights-only
expect_error "--format takes e4m3 or e5m2, got 'e3m4'" quantize "$out/cmp/runs/f32" --out "$out/q4.safetensors" --format e3m4
expect_error "the element format e5m2 applies to amax and cscale only" quantize "$out/cmp/runs/f32" --out "$out/q4.safetensors" --method mx --format e5m2
expect_error "unknown quantisation method 'nvfp8' (valid: amax, cscale, mx, nvfp4, mxfp4)" quantize "$out/cmp/runs/f32" --out "$out/q3.safetensors" --method nvfp8
expect_error "which this command reads or the run owns" quantize "$out/cmp/runs/f32" --out "$out/cmp/runs/f32/checkpoint.safetensors"
# ... nor any other file of the run folder.
cp "$out/cmp/runs/f32/model.safetensors" "$out/model_kept"
for f in model.safetensors config.toml metrics.jsonl; do
  expect_error "which this command reads or the run owns" quantize "$out/cmp/runs/f32/checkpoint.safetensors" --out "$out/cmp/runs/f32/$f"
done
cmp -s "$out/model_kept" "$out/cmp/runs/f32/model.safetensors" || { echo "quantize replaced the run's model"; exit 1; }
mkdir -p "$out/emptyrun"
expect_error "'$out/emptyrun' holds no checkpoint.safetensors" inspect "$out/emptyrun"
expect_error "'$out/emptyrun' holds no checkpoint.safetensors" eval "$out/emptyrun"
expect_error "is neither a regular file nor a folder" quantize "$out/cmp/runs/f32" --sweep 0:1 --data /dev/zero
test ! -e "$out/q2.safetensors" && test ! -e "$out/q3.safetensors" || { echo "a failed quantize left a file"; exit 1; }
# A corrupt metrics.jsonl stops inspect before it writes anything.
cp -r "$out/cmp/runs/current" "$out/badrun" && rm -rf "$out/badrun/inspect" && echo '{broken' >> "$out/badrun/metrics.jsonl"
expect_error "is not a metrics record" inspect "$out/badrun"
test ! -e "$out/badrun/inspect" || { echo "inspect wrote output before failing on its input"; exit 1; }
# Run folders (issue 29). Writes never replace what is not a regular file; inputs that would block
# (a FIFO) are refused, not waited on.
mkfifo "$out/fifo"
expect_error "cannot write '$out/fifo': it exists and is not a regular file" quantize "$out/cmp/runs/f32" --out "$out/fifo"
test -p "$out/fifo" || { echo "quantize replaced a FIFO with a file"; exit 1; }
expect_error "is not a regular file" train --config "$out/fifo" --out "$out/r29"
expect_error "is not a regular file" eval "$out/fifo"
expect_error "config: '$out' is a folder, not a file" train --config "$out" --out "$out/r29"
expect_error "--recipe is empty" train --recipe "" --out "$out/r29" --steps 1
expect_error "--out has no place beside it" train --resume "$out/cmp/runs/f32" --out "$out/r29"
expect_error "--seed: must be a decimal integer in [0, 2^64), got '99999999999999999999999'" sample "$out/cmp/runs/f32" --seed 99999999999999999999999
expect_error "--top-k: must be a decimal integer within 64 bits, got '0x10'" sample "$out/cmp/runs/f32" --top-k 0x10
expect_error "'steps' must be a decimal integer within 64 bits, got ' 3'" train --set "steps= 3" --out "$out/r29"
# "010" is ten, not CLI11's octal eight.
"$cli" train --steps 010 --out "$out/r10" --set d_model=16 --set layers=1 --set heads=1 --set seq=16 --set batch=2 \
  --set eval_windows=2 2> /dev/null | grep -q "^steps: 10 (skipped 0)$" || { echo "--steps 010 was not 10 steps"; exit 1; }
expect_error "--config has no place beside it" train --resume "$out/r10" --config "$out/r10/config.toml"
expect_error "compare: --resume needs a comparison folder" compare --resume ""
expect_error "seed 2 is given twice" compare --seeds 2,2 --out "$out/seeds_bad"
expect_error "give a count from 1 to 100" compare --seeds 0 --out "$out/seeds_bad"
expect_error "'x' is not a seed" compare --seeds 1,x --out "$out/seeds_bad"
expect_error "must be a decimal integer" compare --speed-rounds -1 --out "$out/seeds_bad"
expect_error "--speed-rounds must be 0 to 100" compare --speed-rounds 101 --out "$out/seeds_bad"
expect_error "drop --seeds" compare --resume "$out/cmp" --seeds 3
test ! -e "$out/seeds_bad" || { echo "bad --seeds left a folder"; exit 1; }
expect_error "needs at least" train --set d_model=65536 --set heads=1 --out "$out/r29"
expect_error "File name too long" train --out "$out/$(printf 'a%.0s' {1..300})" --steps 1
# A resume must train further, and keep its recipe; a refused one leaves the run as it was.
cp "$out/cmp/runs/current/model.safetensors" "$out/model_before"
expect_error "is at step 3 and --steps is 2; a resume trains further" train --resume "$out/cmp/runs/current" --steps 2
expect_error "recipe 'delayed' differs from the one" train --resume "$out/cmp/runs/current" --recipe delayed --steps 5
# ... and its model's shape: fewer layers would drop tensors of the checkpoint, other heads read them otherwise.
expect_error "has layers = 1, not 2; a run keeps its model's shape" train --resume "$out/cmp/runs/current" --set layers=2 --steps 5
expect_error "has heads = 1, not 2; a run keeps its model's shape" train --resume "$out/cmp/runs/current" --set heads=2 --steps 5
cmp -s "$out/model_before" "$out/cmp/runs/current/model.safetensors" || { echo "a refused resume changed the model"; exit 1; }
test ! -e "$out/r29" || { echo "a refused train created its run folder"; exit 1; }
# A flipped bit in a checkpoint's tensor data is caught by its checksum, naming the tensor.
cp "$out/cmp/runs/f32/model.safetensors" "$out/flipped.safetensors"
size=$(stat -c %s "$out/flipped.safetensors")
byte=$(od -An -tu1 -j $((size - 100)) -N1 "$out/flipped.safetensors" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 4)))" | dd of="$out/flipped.safetensors" bs=1 seek=$((size - 100)) conv=notrunc status=none
cmp -s "$out/flipped.safetensors" "$out/cmp/runs/f32/model.safetensors" && { echo "the bit flip changed nothing"; exit 1; }
expect_error "fails its checksum (CRC-32C" eval "$out/flipped.safetensors"
# Pretrained models (tests/data/hf): eval --model on text and on its llm.c token file agree; a
# trained byte-level model exports to a Hugging Face folder that evaluates as the run did.
hf="$(dirname "$(realpath "$0")")/data/hf"
head -c 20000 /usr/share/games/fortunes/computers > "$out/text"
"$cli" eval --model "$hf/tiny_gpt2" --data "$out/text" --json > "$out/eval_text" 2> /dev/null
grep -Eq '^\{"val_loss": [0-9.e+-]+, "val_bpb": [0-9.e+-]+, "windows": [0-9]+, "perplexity": [0-9.e+-]+, "tokens": [0-9]+, "context": 64\}$' \
  "$out/eval_text" || { echo "eval --model --json is not one JSON object"; cat "$out/eval_text"; exit 1; }
"$cli" tokenize --model "$hf/tiny_gpt2" --data "$out/text" --out "$out/text.bin" | grep -q "20000 bytes -> "
"$cli" eval --model "$hf/tiny_gpt2" --data "$out/text.bin" --json 2> /dev/null | cmp -s - "$out/eval_text" \
  || { echo "the token file evaluates differently from its text"; exit 1; }
"$cli" eval --model "$hf/tiny_llama_gqa" --data "$out/text" --context 32 --windows 3 | grep -q "(96 tokens in 3 windows of 32)"
# A GGUF file in the folder's place (tests/data/gguf): token files evaluate; this one holds no
# tokenizer, which text and tokenize say; a truncated file is an error naming it.
gguf="$(dirname "$(realpath "$0")")/data/gguf"
"$cli" eval --model "$gguf/tiny_llama_gqa.gguf" --data "$out/text.bin" --context 32 --windows 3 | grep -q "(96 tokens in 3 windows of 32)"
expect_error "a GGUF file's tokenizer is read where its tokenizer.ggml.model is" eval --model "$gguf/tiny_llama_gqa.gguf" --data "$out/text"
expect_error "metadata 'tokenizer.ggml.model' is missing" tokenize --model "$gguf/tiny_llama_gqa.gguf" --data "$out/text" --out "$out/g.bin"
head -c 3000 "$gguf/tiny_llama_gqa.gguf" > "$out/truncated.gguf"
expect_error "$out/truncated.gguf: tensor 'token_embd.weight''s data (128000 bytes at offset 0 of the data section) runs past the end of the file" eval --model "$out/truncated.gguf" --data "$out/text.bin"
"$cli" export "$out/cmp/runs/f32" --out "$out/exported" | grep -q "^gpt2 model written to "
"$cli" export "$out/cmp/runs/f32" --format gguf --dtype bf16 --out "$out/exported.gguf" \
  | grep -q "^gpt2 model written to .* (GGUF, bf16 weights, with its tokenizer)$"
head -c 4 "$out/exported.gguf" | grep -q "^GGUF$" || { echo "export --format gguf wrote no GGUF file"; exit 1; }
expect_error "--dtype q8_0 is for --format gguf" export "$out/cmp/runs/f32" --out "$out/exported_q8" --dtype q8_0
"$cli" tokenize --model "$out/exported" --data "$out/text" --out "$out/bytes.bin" | grep -q "20000 bytes -> 20000 tokens"
mkdir -p "$out/notok" && cp "$hf/tiny_gpt2/config.json" "$hf/tiny_gpt2/model.safetensors" "$out/notok/"
expect_error "the model folder has no tokenizer" eval --model "$out/notok" --data "$out/text"
expect_error "--model needs --data" eval --model "$hf/tiny_gpt2"
# A FIFO as --data of the token-reading paths is refused, not waited on (the token-file sniff
# opened it blocking); tokenize never writes over its input or the model folder's files.
expect_error "data: '$out/fifo' is not a regular file" eval --model "$hf/tiny_gpt2" --data "$out/fifo"
expect_error "data: '$out/fifo' is not a regular file" quantize --model "$hf/tiny_gpt2" --data "$out/fifo"
expect_error "data: '$out/fifo' is not a regular file" train --init "$hf/tiny_gpt2" --data "$out/fifo" --out "$out/fifo_run" --steps 1
cp "$out/text" "$out/text_copy"
expect_error "which this command reads or the run owns" tokenize --model "$hf/tiny_gpt2" --data "$out/text_copy" --out "$out/text_copy"
cmp -s "$out/text" "$out/text_copy" || { echo "tokenize overwrote its input"; exit 1; }
mkdir -p "$out/model_copy" && cp "$hf/tiny_gpt2/"* "$out/model_copy/"
expect_error "which this command reads or the run owns" tokenize --model "$out/model_copy" --data "$out/text" --out "$out/model_copy/vocab.json"
cmp -s "$hf/tiny_gpt2/vocab.json" "$out/model_copy/vocab.json" || { echo "tokenize overwrote the vocabulary"; exit 1; }
expect_error "context must be in [1, 64]" eval --model "$hf/tiny_gpt2" --data "$out/text" --context 65
expect_error "not a model folder" eval --model "$out/none" --data "$out/text"
expect_error "outside the model's vocabulary of 256" eval --model "$out/exported" --data "$out/text.bin"
expect_error "excludes" eval "$out/cmp/runs/f32" --model "$hf/tiny_gpt2"
"$cli" quantize --model "$hf/tiny_llama" --data "$out/text" --sweep -1:1 --windows 4 --out "$out/ptq_hf" > "$out/ptq_hf.log" 2> /dev/null
grep -q "^| fp8_cscale | 1 | " "$out/ptq_hf.log"
grep -q "^| 1 | ff output | " "$out/ptq_hf.log"
for f in report.md sweep.csv scaling_biases.csv scaling_biases.png; do test -s "$out/ptq_hf/$f" || { echo "quantize --model wrote no $f"; exit 1; }; done
"$cli" quantize --model "$hf/tiny_gpt2" --data "$out/text" --method mx --windows 4 | grep -q "^mx: loss [0-9.]*, perplexity"
"$cli" sample --model "$hf/tiny_gpt2" --prompt "The computer" --tokens 5 --temperature 0 | grep -q "^The computer"
# End of sequence: generation_config.json's eos ids (here every id) end the text; --ignore-eos runs on.
mkdir -p "$out/eos_model" && cp "$hf/tiny_gpt2/"* "$out/eos_model/"
echo "{\"eos_token_id\": [$(seq -s, 0 999)]}" > "$out/eos_model/generation_config.json"
test "$("$cli" sample --model "$out/eos_model" --prompt "The computer" --tokens 5 --temperature 0)" = "The computer" ||
  { echo "sample ran past the eos"; exit 1; }
test "$("$cli" sample --model "$out/eos_model" --prompt "The computer" --tokens 5 --temperature 0 --ignore-eos)" = \
  "$("$cli" sample --model "$hf/tiny_gpt2" --prompt "The computer" --tokens 5 --temperature 0 --ignore-eos)" || { echo "--ignore-eos stopped"; exit 1; }
"$cli" train --init "$hf/tiny_llama_gqa" --data "$out/text" --out "$out/ft" --steps 3 --set batch=2 --set eval_windows=2 > "$out/ft.log" 2> /dev/null
grep -q "^unigram entropy of the training tokens: " "$out/ft.log"
grep -q "validation tokens, SentencePiece" "$out/ft/train.log"
"$cli" sample "$out/ft" --prompt "Fortune" --tokens 4 | grep -q "^Fortune"
# A model fine-tuned from one with an eos (every id here) stops at it too.
mkdir -p "$out/eos_llama" && cp "$hf/tiny_llama_gqa/"* "$out/eos_llama/"
echo "{\"eos_token_id\": [$(seq -s, 0 999)]}" > "$out/eos_llama/generation_config.json"
"$cli" train --init "$out/eos_llama" --data "$out/text" --out "$out/ft_eos" --steps 1 --set batch=2 --set eval_windows=2 > /dev/null 2>&1
test "$("$cli" sample "$out/ft_eos" --prompt "Fortune" --tokens 4)" = "Fortune" || { echo "a fine-tuned sample ran past the eos"; exit 1; }
test "$("$cli" sample "$out/ft_eos" --prompt "Fortune" --tokens 4 --ignore-eos)" != "Fortune" || { echo "--ignore-eos stopped"; exit 1; }
"$cli" export "$out/ft" --out "$out/ft_hf" --dtype bf16 > /dev/null
test -s "$out/ft_hf/tokenizer.model" || { echo "export left the fine-tuned model's tokenizer behind"; exit 1; }
expect_error "a SentencePiece tokenizer (tokenizer.model); GGUF export writes byte-level BPE" export "$out/ft" --format gguf --out "$out/ft.gguf"
test ! -e "$out/ft.gguf" || { echo "a refused GGUF export wrote a file"; exit 1; }
"$cli" eval --model "$out/ft_hf" --data "$out/text" --windows 2 | grep -q "^llama model, SentencePiece"
expect_error "--init has no place beside it" train --resume "$out/ft" --init "$hf/tiny_gpt2" --steps 5
expect_error "gives the model's shape" train --init "$hf/tiny_gpt2" --data "$out/text" --out "$out/ft2" --set d_model=32
expect_error "holds no tokenizer" sample --model "$out/notok"
expect_error "--model needs --data" quantize --model "$hf/tiny_gpt2"
expect_error "needs LO <= HI" quantize --model "$hf/tiny_gpt2" --data "$out/text" --sweep 3:1
# A pretrained model quantised into a file that eval runs (evaluated as quantize --model evaluates it).
"$cli" quantize --model "$hf/tiny_gpt2" --method cscale --bias 1 --context 32 --out "$out/q3.safetensors" | grep -q "^wrote $out/q3.safetensors"
"$cli" eval "$out/q3.safetensors" --data "$out/text" | grep -q "^validation loss: "
expect_error "is not an empty folder" export "$out/cmp/runs/f32" --out "$out/exported"
expect_error "takes neither --method" quantize --model "$hf/tiny_gpt2" --data "$out/text" --sweep -1:1 --method mx
expect_error "give a checkpoint or --model" quantize --out "$out/q2.safetensors"
expect_error "--dtype: f8 not in" export "$out/cmp/runs/f32" --out "$out/x2" --dtype f8
# A format named twice (or by an alias) appears once.
"$cli" snr --out "$out/dup" --from 0 --to 1 --samples 64 --formats e4m3,e4m3,fp8_e4m3 > /dev/null 2>&1
test "$(grep -c ',e4m3,' "$out/dup/snr.csv")" -eq 5
echo "cli ok"
