#!/usr/bin/env bash
# Build ggk_cond (the engine's text conditioning, bench/engine_driver/ggk_cond.cpp) against the
# ggk 0.9.7 sdist's own sources, unchanged:
#   ENGINE=/path/to/ggk-0.9.7 OUT=/path/to/build ./build_cond.sh   (bench/engine_check.py sets both)
# 1. the sdist's CMake builds its CPU backend (targets ggml: libggml.a + libgk.a), ~1-2 min;
# 2. g++ compiles the engine .cpp files the text conditioners need (model loading, name
#    conversion, the model manager, GGUF/safetensors readers, the tokenizers) with the flags
#    the engine's CMake gives its diffusion library, plus vocab_min.cpp and vocab_cond.cpp (the
#    vocabulary accessors these packs reach, reading the same compiled-in data as the engine's
#    tokenizers/vocab/vocab.cpp, and aborting stubs for the rest) and the driver; ~4 min on 2
#    cores the first time.
# Objects are cached in $OUT; a changed source is recompiled.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ENGINE="${ENGINE:?set ENGINE to the unpacked ggk-0.9.7 sdist}"
E="$ENGINE/vendor/engine"
S="$E/diffusion/src"
[ -f "$S/conditioning/conditioner.hpp" ] || { echo "engine source not found under $ENGINE" >&2; exit 1; }
OUT="${OUT:-$HERE/build}"; B="$OUT/cond-obj"; mkdir -p "$B"
JOBS="${JOBS:-$(nproc)}"

if [ ! -f "$OUT/cmake/ggk-engine/gk/compat/libggml.a" ]; then
    echo "  CMake: the engine's CPU backend (ggml)" >&2
    cmake -S "$ENGINE" -B "$OUT/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGK_METAL=OFF -DGGK_OPENSSL=OFF \
          -DGGK_SUBPROCESS=OFF >"$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log" >&2; exit 1; }
    cmake --build "$OUT/cmake" --target ggml -j "$JOBS" >"$OUT/ggml.log" 2>&1 || { tail -20 "$OUT/ggml.log" >&2; exit 1; }
fi
LIBS=("$OUT/cmake/ggk-engine/gk/compat/libggml.a" "$OUT/cmake/ggk-engine/gk/compat/gk/libgk.a")

CXX="${CXX:-g++}"
# the engine's diffusion library flags (diffusion/CMakeLists.txt; GGML_MAX_NAME from the top level)
FLAGS=(-std=gnu++17 -O2 -DNDEBUG -DGGML_MAX_NAME=128 -DGK_MAX_NAME=128 -w)
INC=(-I"$E/diffusion" -I"$S" -I"$E/diffusion/include" -I"$S/core" -I"$E/diffusion/thirdparty"
     -I"$E/gk/compat/include" -I"$E/gk/include")
SOURCES=(core/util.cpp core/ggml_extend_backend.cpp core/ggml_graph_cut.cpp core/layer_split_partition.cpp
         model_loader.cpp name_conversion.cpp model_manager.cpp model_io/gguf_io.cpp model_io/safetensors_io.cpp
         tokenizers/tokenizer.cpp tokenizers/bpe_tokenizer.cpp tokenizers/qwen2_tokenizer.cpp
         tokenizers/qwen35_tokenizer.cpp tokenizers/ling_tokenizer.cpp tokenizers/t5_unigram_tokenizer.cpp
         tokenizers/clip_tokenizer.cpp tokenizers/mistral_tokenizer.cpp tokenizers/gemma_tokenizer.cpp
         tokenizers/gpt_oss_tokenizer.cpp tokenizers/sensenova_u1_tokenizer.cpp
         tokenizers/vocab_provider.cpp tokenizers/hf_tokenizer_json.cpp tokenizers/tokenize_util.cpp)

objects=()
compile() {  # src out
    if [ ! -f "$2" ] || [ "$1" -nt "$2" ] || [ "$HERE/build_cond.sh" -nt "$2" ]; then
        echo "  CXX $(basename "$1")" >&2
        "$CXX" "${FLAGS[@]}" "${INC[@]}" -c "$1" -o "$2"
    fi
}
export -f compile; export CXX HERE; export FLAGS_STR="${FLAGS[*]}"
jobs=()
for src in "${SOURCES[@]}" ; do
    obj="$B/$(echo "$src" | tr '/' '_' | sed 's/\.cpp$/.o/')"
    objects+=("$obj"); jobs+=("$S/$src|$obj")
done
for own in vocab_min vocab_cond ggk_cond; do objects+=("$B/$own.o"); jobs+=("$HERE/$own.cpp|$B/$own.o"); done
printf '%s\n' "${jobs[@]}" | xargs -P "$JOBS" -I{} bash -c 'IFS="|" read -r src obj <<<"{}"; \
    if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ "$HERE/build_cond.sh" -nt "$obj" ]; then \
      echo "  CXX $(basename "$src")" >&2; "$CXX" '"${FLAGS[*]} ${INC[*]}"' -c "$src" -o "$obj" || exit 255; fi'
"$CXX" -o "$OUT/ggk_cond" "${objects[@]}" "${LIBS[@]}" -lpthread -fopenmp
echo "built $OUT/ggk_cond" >&2
