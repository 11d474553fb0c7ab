#!/usr/bin/env bash
# Build ggk_tok (C library isspace as the Linux/glibc engine build sees it) and
# ggk_tok_ucrt (isspace as the Windows/MSVC engine build sees it) from the ggk 0.9.7
# engine's own tokenizer sources, unchanged.
#   ENGINE=/path/to/ggk-0.9.7 OUT=/path/to/build ./build.sh   (bench/engine_tokenizer.py sets both)
# ~30 s on 2 cores; objects are cached in $OUT (delete it to rebuild).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ENGINE="${ENGINE:?set ENGINE to the unpacked ggk-0.9.7 sdist}"
E="$ENGINE/vendor/engine"
S="$E/diffusion/src"
[ -f "$S/tokenizers/tokenize_util.cpp" ] || { echo "engine source not found under $ENGINE" >&2; exit 1; }
CXX="${CXX:-g++}"
# GGML_MAX_NAME=128: the engine's top-level CMakeLists.txt:163 sets it for every target
FLAGS=(-std=c++17 -O1 -DGGML_MAX_NAME=128 -DGK_MAX_NAME=128 -ffunction-sections -fdata-sections -w)
INC=(-I"$E/diffusion" -I"$S" -I"$E/diffusion/include" -I"$S/core" -I"$E/diffusion/thirdparty" -I"$E/gk/compat/include")
OUT="${OUT:-$HERE/build}"; B="$OUT/obj"; mkdir -p "$B"

compile() {  # out src [extra flags...]
    local out="$1" src="$2"; shift 2
    if [ ! -f "$out" ] || [ "$src" -nt "$out" ] || [ "$HERE/build.sh" -nt "$out" ]; then
        echo "  CXX $(basename "$src") -> $(basename "$out")"
        "$CXX" "${FLAGS[@]}" "${INC[@]}" "$@" -c "$src" -o "$out"
    fi
}

pids=()
compile "$B/util.o"                 "$S/core/util.cpp" & pids+=($!)
compile "$B/tokenizer.o"            "$S/tokenizers/tokenizer.cpp" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done; pids=()
compile "$B/bpe_tokenizer.o"        "$S/tokenizers/bpe_tokenizer.cpp" & pids+=($!)
compile "$B/qwen2_tokenizer.o"      "$S/tokenizers/qwen2_tokenizer.cpp" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done; pids=()
compile "$B/t5_unigram_tokenizer.o" "$S/tokenizers/t5_unigram_tokenizer.cpp" & pids+=($!)
compile "$B/vocab_provider.o"       "$S/tokenizers/vocab_provider.cpp" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done; pids=()
compile "$B/hf_tokenizer_json.o"    "$S/tokenizers/hf_tokenizer_json.cpp" & pids+=($!)
compile "$B/vocab_min.o"            "$HERE/vocab_min.cpp" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done; pids=()
compile "$B/tokenize_util.o"        "$S/tokenizers/tokenize_util.cpp" & pids+=($!)
compile "$B/tokenize_util_ucrt.o"   "$S/tokenizers/tokenize_util.cpp" -include "$HERE/isspace_ucrt.h" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done; pids=()
compile "$B/ggk_tok.o"              "$HERE/ggk_tok.cpp" & pids+=($!)
compile "$B/ggk_tok_ucrt.o"         "$HERE/ggk_tok.cpp" -include "$HERE/isspace_ucrt.h" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done

COMMON=("$B/util.o" "$B/tokenizer.o" "$B/bpe_tokenizer.o" "$B/qwen2_tokenizer.o" "$B/t5_unigram_tokenizer.o"
        "$B/vocab_provider.o" "$B/hf_tokenizer_json.o" "$B/vocab_min.o")
# --gc-sections drops the parts of core/util.cpp that need ggml (never called here);
# stubs.cpp supplies what is still referenced from kept sections.
compile "$B/stubs.o" "$HERE/stubs.cpp"
"$CXX" -o "$OUT/ggk_tok"      "$B/ggk_tok.o"      "$B/tokenize_util.o"      "${COMMON[@]}" "$B/stubs.o" -Wl,--gc-sections
"$CXX" -o "$OUT/ggk_tok_ucrt" "$B/ggk_tok_ucrt.o" "$B/tokenize_util_ucrt.o" "${COMMON[@]}" "$B/stubs.o" -Wl,--gc-sections
echo "built $OUT/ggk_tok and $OUT/ggk_tok_ucrt"
